"""`python -m grpo.config > docs/config.md`: the configuration reference, from the keys' docstrings."""

from grpo.config import reference_markdown

print(reference_markdown())
