"""Costs: profiled and analytical node times, the memory model, the communication model.

Only ``cost.profile`` (and the measuring parts of ``cost.analytical``) import torch.
"""
