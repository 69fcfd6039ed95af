"""What `tfaccel launch` is made of: the launcher itself (`launch.py`) and what it starts beside
the workers (rendezvous, output relay, data servers), which lower layers share."""
