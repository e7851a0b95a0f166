"""The decode loop of one request: transcript, proposers, acceptance, one strategy per mode."""
