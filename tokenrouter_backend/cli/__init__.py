"""The `tokenrouter` command and its subcommands.
"""
