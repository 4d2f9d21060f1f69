"""Where a user's own code is found: a reward, a tool or an environment given by name.

One lookup (`user_object`) for all three: a built-in by its name, else

- `module:object`: the module is taken from the working directory first, where a user keeps the
  file a config names, else from wherever Python finds it. The working directory goes at the end
  of the search path, so the user's module can import its neighbours but no file there hides a
  module the library or its dependencies import;
- `file.py:object`, or `path/to/file.py:object`: that Python file, read by its path (relative to
  the working directory), under a module name made from its real path, so every process that reads
  the same file gives it the same name (objects of it pickled in one are unpickled in another).
  Its directory goes at the end of the search path, for its own imports of its neighbours.

`find` resolves a `module:object` or `file.py:object` target, in the process that resolves a config
and in the worker processes of sandbox/pool.py, which are given the target `target_of` makes (the
path, for an object of a file read by its path) and start in the caller's working directory with
the caller's search path: they find the same object the caller found.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from typing import Any

_FILES: dict[str, str] = {}     # module name -> the real path of a file read by its path


def import_user_module(name: str):
    """The module `name`, from the working directory first, else as Python finds it (the module
    docstring). A module of that name already imported stays the one used (the library's own
    `grpo`, or `json`: a `json.py` of the user's is then not read, which `find` says)."""
    here = os.getcwd()
    top = name.partition(".")[0]
    importlib.invalidate_caches()               # a file written since the last import is seen
    spec = importlib.machinery.PathFinder.find_spec(top, [here])
    if spec is not None and top not in sys.modules:
        if here not in sys.path:
            sys.path.append(here)               # last: for the module's own imports of its neighbours
        if spec.origin is not None:             # a file or a package (a plain directory is not taken first)
            _executed(spec, top)
    return importlib.import_module(name)


def _executed(spec, name: str):
    """The module of `spec`, run under `name` in sys.modules (left out again if it raises)."""
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_user_file(path: str):
    """The module of the Python file at `path`, read once a process under a name made from its
    real path (the module docstring); FileNotFoundError when there is no such file."""
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise FileNotFoundError(real)
    stem = re.sub(r"\W", "_", os.path.basename(real).removesuffix(".py"))
    name = f"user_file_{stem}_{hashlib.sha1(real.encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    folder = os.path.dirname(real)
    if folder not in sys.path:
        sys.path.append(folder)                 # last: for the file's own imports of its neighbours
    module = _executed(importlib.util.spec_from_file_location(name, real), name)
    _FILES[name] = real
    return module


def target_of(module: str, qualname: str) -> str:
    """What `find` takes to find `module.qualname` again, in any process: `module:qualname`, or
    `path.py:qualname` for an object of a file read by its path."""
    return f"{_FILES.get(module, module)}:{qualname}"


def _unread_file(module) -> str:
    """Where a user's file of the module's name, in the working directory, was passed over."""
    top = module.__name__.partition(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
    mine = None if spec is None else spec.origin
    read = getattr(sys.modules.get(top), "__file__", None)
    if mine is None or (read and os.path.realpath(read) == os.path.realpath(mine)):
        return ""
    return (f"; {mine} was not read, as a module named '{top}' was imported before it: rename "
            "your file")


def _module(module_name: str):
    """The module `module:...` names, or an ImportError saying what is missing and where."""
    try:
        return import_user_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name.partition(".")[0]:     # the module itself imports what is missing
            raise ImportError(f"cannot import module '{module_name}' ({e})") from None
        raise ImportError(f"cannot import module '{module_name}': no {e.name}.py in the working "
                          f"directory ({os.getcwd()}) nor on Python's path") from None
    except Exception as e:  # noqa: BLE001 - a user's module may raise anything as it loads
        raise ImportError(f"cannot import module '{module_name}' ({type(e).__name__}: {e})") from None


def _file(path: str):
    """The module of the file `path.py:...` names, or an ImportError saying what went wrong."""
    if not os.path.isfile(path):
        raise ImportError(f"cannot read file '{path}': no such file (looked for "
                          f"{os.path.abspath(path)})")
    try:
        return import_user_file(path)
    except Exception as e:  # noqa: BLE001 - a user's file may raise anything as it loads
        raise ImportError(f"cannot import file '{path}' ({type(e).__name__}: {e})") from None


def find(target: str, kind: str = "function") -> Any:
    """The object `module:qualname` or `file.py:qualname` names (the module docstring); an
    ImportError whose message says what is missing and where it was looked for."""
    path, _, qualname = target.rpartition(":")
    if path.endswith(".py"):
        module, where, unread = _file(path), f"file '{path}'", False
    else:
        module_name, _, qualname = target.partition(":")
        module, where, unread = _module(module_name), f"module '{module_name}'", True
    found: Any = module
    for part in qualname.split("."):
        if not hasattr(found, part):
            names = [n for n in dir(module) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            raise ImportError(f"{where} has no {kind} '{qualname}'"
                              + (f" (did you mean '{close[0]}'?)" if close else "")
                              + f"; it was read from {getattr(module, '__file__', None) or 'the interpreter'}"
                              + (_unread_file(module) if unread else ""))
        found = getattr(found, part)
    return found


def user_object(name: str, builtins: dict, *, what: str, error: type[Exception],
                kind: str = "function", not_callable: str = "a function",
                form: str = "module:function") -> Any:
    """The built-in `name` names, else the callable `module:object` or `file.py:object` names
    (`find`, with `kind` in its messages); else `error`, its message naming `what` (such as
    "reward function") and `name`: one that cannot be found or imported, one that is not callable
    (`not_callable` says what it must be), or an unknown name (the built-ins, and `form`)."""
    if isinstance(name, str) and ":" in name:
        try:
            found = find(name, kind)
        except ImportError as e:
            raise error(f"{what} '{name}': {e}") from None
        if not callable(found):
            raise error(f"{what} '{name}' is not {not_callable} (its type is "
                        f"{type(found).__name__})")
        return found
    if name not in builtins:
        raise error(f"unknown {what} '{name}'; built-ins are {sorted(builtins)}, or give your own "
                    f"as {form}")
    return builtins[name]
