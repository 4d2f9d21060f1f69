"""grpo: Group Relative Policy Optimization and its family."""

__version__ = "0.1.0"
