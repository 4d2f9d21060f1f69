"""`grpo launch --nodes A,B --server-nodes C,D`: the commands that run one run across machines,
printed, one for each machine, for you (or a scheduler's script) to start there. Nothing is
started: launch cannot start a process on another machine.

    on each of C, D   a vLLM server listening on that machine's name (--host C), on --port (8000),
                      with what the run needs (as launch starts its own: commands/launch.py)
    on each of A, B   the trainer under torchrun: --nnodes 2, --nproc-per-node N, the c10d
                      rendezvous on A:29400, vllm_url=[http://C:8000,http://D:8000]

What must hold for them, said in the printed header: every machine reaches the others by those
names; the weights directory (vllm_weights_dir, required: a server reads each weight version from
a file by its path) and the run's output_dir are on a file system every machine sees at the same
path; each line runs in an environment where `python` has grpo (and vLLM, on the servers').
docs/guides/scaling-out.md runs them on machines made of network namespaces.
"""

from __future__ import annotations

import os
import secrets
import shlex
from pathlib import Path

RENDEZVOUS_PORT = 29400    # torchrun's c10d store on the first trainer machine


def node_commands(path: str | None, overrides: list[str], nodes: list[str], server_nodes: list[str],
                  config, nproc: int = 1, port: int = 8000) -> list[tuple[str, str, str]]:
    """(machine, what runs there, the shell line) for each server, then each trainer machine;
    `config` is the run's, as launch_config loads it."""
    from grpo.commands.launch import check_inputs, served_model, server_command, serve_env
    from grpo.config import ConfigError
    weights = config.sampling.vllm_weights_dir
    if not weights:
        raise ConfigError("config key 'vllm_weights_dir': grpo launch --nodes puts the servers on other "
                          "machines, and a server reads each weight version from a file by its path: set "
                          "vllm_weights_dir= to a directory on a file system every machine shares, at the "
                          "same path")
    check_inputs(config)
    # model=tiny: built where every machine sees it (the trainer sends its weights before the
    # first step, so the servers need its shape alone); any other model, as given
    model = served_model(config, Path(weights) / "grpo-launch-model")
    where = os.getcwd()
    lines = []
    urls = [f"http://{host}:{port}" for host in server_nodes]
    for i, host in enumerate(server_nodes):
        command = ["python"] + server_command(config, model, port, host=host)[1:]
        env = [f"{k}={v}" for k, v in serve_env(config.model.lora_r).items()]
        lines.append((host, f"vLLM server {i + 1} of {len(server_nodes)}",
                      f"cd {shlex.quote(where)} && {' '.join(env)} {shlex.join(command)}"))
    run = ([path] if path else []) + [o for o in overrides if not o.startswith("sampler=")] + [
        "sampler=vllm_server", "vllm_url=" + (urls[0] if len(urls) == 1 else "[" + ",".join(urls) + "]")]
    if len(nodes) == 1 and nproc == 1:
        head = ["python", "-m", "grpo", "train"]
    else:
        head = ["python", "-m", "torch.distributed.run", "--nnodes", str(len(nodes)),
                "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
                f"--rdzv-endpoint={nodes[0]}:{RENDEZVOUS_PORT}", "--rdzv-id", f"grpo-{secrets.token_hex(4)}",
                "-m", "grpo", "train"]
    for i, host in enumerate(nodes):
        lines.append((host, f"trainer, machine {i + 1} of {len(nodes)}",
                      f"cd {shlex.quote(where)} && {shlex.join(head + run)}"))
    return lines


def render(lines: list[tuple[str, str, str]], nodes: list[str], server_nodes: list[str],
           weights: str, output: str) -> str:
    """The commands as a script to read: a header saying what must hold, then for each machine
    a comment naming it and the line to run there (servers first)."""
    out = [f"# grpo launch --nodes: {len(server_nodes)} vLLM server(s) on {', '.join(server_nodes)}, the "
           f"trainer on {', '.join(nodes)}.",
           "# Run each line on the machine it names, the servers first, in an environment where `python`",
           "# has grpo (and vLLM, on the servers' machines). Every machine must reach the others by these",
           f"# names, and see {weights} (vllm_weights_dir) and {output} (output_dir) at the same path.",
           "# Each trainer machine's process stops, with the others, where a peer is lost; start them all",
           "# again with resume=auto (docs/faults.md)."]
    for host, what, line in lines:
        out += ["", f"# on {host}: {what}", line]
    return "\n".join(out)


def print_node_commands(path: str | None, overrides: list[str], nodes: list[str],
                        server_nodes: list[str], nproc: int = 1, port: int | None = None) -> str:
    """What `grpo launch --nodes` prints."""
    from grpo.commands.launch import launch_config
    config = launch_config(path, overrides)
    lines = node_commands(path, overrides, nodes, server_nodes, config, nproc, port or 8000)
    return render(lines, nodes, server_nodes, config.sampling.vllm_weights_dir,
                  str(Path(config.run.output_dir).resolve()))


def launch_on_nodes(path: str | None, overrides: list[str], options: dict, numbers: dict) -> None:
    """`grpo launch ... --nodes A,B --server-nodes C,D` (cli.py): the flags checked, the commands
    printed."""
    from grpo.commands.launch import LaunchError as UsageError   # said as the CLI says a usage error
    nodes, server_nodes = (_names(options.get(flag), flag, UsageError) for flag in ("nodes", "server-nodes"))
    if not (nodes and server_nodes):
        raise UsageError("--nodes (the trainer's machines) and --server-nodes (the vLLM servers') "
                         "go together: grpo launch prints the commands for both")
    if numbers["servers"]:
        raise UsageError("--servers N shares this machine among N servers; with --server-nodes "
                         "each machine named runs one server")
    print(print_node_commands(path, overrides, nodes, server_nodes,
                              nproc=numbers["nproc-per-node"] or 1, port=numbers["port"]))


def _names(value, flag: str, error) -> list[str]:
    """--nodes a,b: the machines' names (or addresses), each once."""
    if value is None:
        return []
    names = [n.strip() for n in str(value).split(",")]
    if not all(names) or len(set(names)) != len(names) or any(c in n for n in names for c in " /:@"):
        raise error(f"--{flag} takes the machines' names or addresses, comma-separated, each "
                    f"once, got {value!r}")
    return names
