"""Reading what others may have written, safely: a file only its owner could have written
(`trusted.read_trusted`), a user script's flags read from its code without running it
(`script_flags.declares_flag`). Standard library only."""
