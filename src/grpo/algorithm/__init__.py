"""The algorithm, pure: plain functions on tensors and lists with explicit arguments (no
transformers, no torch.distributed, no config objects, no logging). Each variant is one function,
one table entry and one test.

    advantages   rewards -> advantages (GRPO's group z-score, Dr. GRPO, RLOO, ...), group selection
    loss         the clipped surrogate and its family, KL estimators, aggregations
    corrections  off-policy corrections: weights on each token's surrogate (TIS, IcePop, ...)
    shaping      reward shaping (DAPO's overlong penalty)
    passk        pass@k and maj@k estimators
"""
