"""The contract between the router and its branches, and a request's parameters."""
