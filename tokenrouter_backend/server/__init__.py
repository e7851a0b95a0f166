"""Running the wheel's tritonserver: backend directory preparation, log parsing, the process
lifecycle; the data directory.
"""
