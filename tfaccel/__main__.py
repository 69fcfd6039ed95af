import sys

from tfaccel.cli import main

sys.exit(main())
