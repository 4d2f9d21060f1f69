"""Running code grpo does not trust: a policy's programs and a user's modules.

    isolate   one program in a fresh process: limits, namespaces, an unprivileged user, no network
    harness   the program run inside it, which checks the tests and reports results it can trust
    pool      killable worker processes with deadlines, and where a user's `module:function` lives
"""
