"""Tools and environments: user code a multi-turn episode calls, with deadlines, its failures
turned into observations and counted.

    tools          tool calls: formats, parsing, running them
    environments   environments: reset/step, checks, deadlines
"""
