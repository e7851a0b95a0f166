"""Operating the router: admission, A/B, the override switch, decision log and replay, load and
threshold control, metrics.
"""
