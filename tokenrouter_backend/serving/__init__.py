"""Everything that touches Triton's pb_utils: the router and branch models, pre/postprocessing
glue, tensor I/O, request parsing.
"""
