"""Offline router learning: training the learned router on verify-mode decision logs, outcome
labels, route replay (tables and the HTML view), and the router's training prompts.
"""
