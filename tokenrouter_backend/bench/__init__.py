"""Benchmarks users run against a server: `tokenrouter bench`, `tokenrouter humaneval`, the load
and traffic sweeps, reuse workloads, AIPerf tables; their workloads, scoring, records and reports.
"""
