"""Running code grpo does not trust: a policy's programs and a user's modules.

    isolate   one program in a fresh process: limits, namespaces, an unprivileged user, no network
    harness   the program run inside it, which checks the tests and reports results it can trust
    pool      killable worker processes with deadlines
    usercode  the one lookup of a user's code: a built-in name, `module:object` or `file.py:object`
"""
