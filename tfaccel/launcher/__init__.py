"""What `tfaccel launch` starts beside the workers: rendezvous, output relay, data servers."""
