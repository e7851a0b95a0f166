"""Everything that touches Triton's pb_utils: the router and branch models, pre/postprocessing
glue, tensor I/O, request parsing, and the plain callables built from pb_utils that the
layers below get instead (``backend.py``).
"""
