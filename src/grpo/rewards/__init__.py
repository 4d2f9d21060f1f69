"""Step 2 of GRPO: reward functions and how several combine.

Contract: `fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]`.
`prompts` holds each prompt as the model saw it (chat template and system prompt applied; in
`grpo score`, which loads no tokenizer, a conversation's contents one per line) and
`completions` each completion as sampled, as text whether the row's prompt was text or chat
messages; a function marked `as_messages` gets TRL's form instead (messages for chat rows).
Extra dataset columns (such as `answer`) arrive as keyword arguments, one list each. `None` means
"cannot be scored": the row is left out of its group's statistics and gets advantage 0. A list of the
wrong length or a non-finite value is an error that names the function; a bool counts as 1.0 or 0.0.
"""

from grpo.rewards.contract import (REWARDS, UNSCORABLE, RewardError, RewardFn, Unscored, as_messages,
                                   as_values, columns_for, get_reward, reward_name, score,
                                   unique_names)
from grpo.rewards.answers import exact_answer, extract_answer, final_answer, math_accuracy
from grpo.rewards.code import CodeTests, code_tests
from grpo.rewards.tasks import countdown_equation, reasoning_gym
from grpo.rewards.format import think_format

__all__ = ["REWARDS", "RewardError", "UNSCORABLE", "Unscored", "get_reward", "score", "math_accuracy",
           "exact_answer", "think_format", "countdown_equation", "reasoning_gym", "code_tests", "CodeTests",
           "final_answer", "extract_answer", "reward_name", "RewardFn", "unique_names", "as_values", "as_messages", "columns_for"]
