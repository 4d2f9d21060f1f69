"""The `grpo` command and the commands that are not training.

    cli       `grpo train|sft|eval|score|bench|explain|report`: arguments, exit statuses, one-line errors
    bench     `grpo bench`: the step timed on this machine
    score     `grpo score`: a file of completions scored by the rewards
    explain   `grpo explain`: one group's numbers, stage by stage
    launch    `grpo launch`: vLLM servers started, the run on them, the servers stopped
    nodes     `grpo launch --nodes`: the command for each machine of a run across machines, printed
"""
