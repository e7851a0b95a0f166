"""Operating the router: admission, A/B, the override switch, decision log, route setup, load
and threshold control, metrics.
"""
