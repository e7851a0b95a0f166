"""The framework-free core: params, the branch protocol, sampling, acceptance, policy, stopping,
stats, block hooks, the block loop, detokenization. Plain Python + numpy; imports nothing
outside core/.
"""
