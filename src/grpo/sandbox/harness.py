"""The program that runs inside the sandbox, as the sandbox user, and runs a completion's code
against its tests. It uses the standard library only: the trainer sends its source to a fresh
`python -I -S -c` (see isolate.py) with one JSON line on standard input (the job).

Three modes, chosen by the trainer from the row's test format (code.py):

- `stdio`: every case in a forked child of this process, its input on fd 0 and its output to a
  file; this process never runs the completion's code, collects each case's output and exit status
  and sends them back; the trainer compares them with the expected outputs, which never come here.
- `calls`: the completion's code once, then its function on each argument list; the results go
  back as plain values and are compared in the trainer.
- `tests`: two processes. The program's process is forked before the job is read, so it never
  holds the nonce, the tests or the result channel; it runs the completion's code and answers
  calls. The tests' process (this one, not dumpable, so the other cannot read its memory or its
  descriptors) runs the dataset's test program (a HumanEval `check(candidate)`, MBPP asserts) with
  the real builtins, and the program's functions and classes as stand-ins that send each call
  across a pipe: arguments and results travel as plain values (`encode`), so the program sees
  copies, never the tests' objects, frames or modules. What is not a plain value stays in the
  program's process and is known here only as a handle (`Remote`), which may be called, read and
  passed back, but not compared or tested for truth. The trainer has rewritten every `assert` into
  a call that records it: an `assert X == LITERAL` sends only X (the literal stays in the trainer);
  other asserts record whether they held.

Results leave on a duplicate of the original stdout, once, as one line that starts with a nonce
the trainer chose; the program's own stdout goes to /dev/null (tests, calls) or to a file (stdio).

Longer than about 400 lines: it is the program the sandbox runs: its source goes whole to `python
-I -S -c`, standard library only, so it cannot import modules of its own.
"""

import builtins
import collections
import decimal
import fractions
import io
import json
import os
import sys
import types

# Standard-library types whose values are compared as the plain values they hold. Bound here,
# before any program runs, and compared by identity: a class of the program's that calls itself
# `collections.deque` is not one of them.
_COUNTER, _ORDERED, _DEFAULT, _DEQUE = (collections.Counter, collections.OrderedDict,
                                        collections.defaultdict, collections.deque)
_FRACTION, _DECIMAL = fractions.Fraction, decimal.Decimal


class NotPlain(Exception):
    """A value whose type is not one of the plain built-in types (so its `==` cannot be trusted)."""


def _named_tuple(t) -> bool:
    """A class made by collections.namedtuple (a tuple with `_fields`) that defines no `__eq__`."""
    return (t.__bases__ == (tuple,) and isinstance(getattr(t, "_fields", None), tuple)
            and "__eq__" not in vars(t) and "__hash__" not in vars(t))


def encode(value, depth=0, handle=None, _type=type, _dict_items=dict.items,
           _tuple_iter=tuple.__iter__):
    """A plain value as JSON-able data, tagged so a tuple, a set and a dict survive the trip:
    lists stay lists; {"t": [..]} tuple (and a namedtuple), {"s": [..]} set, {"fs": [..]}
    frozenset, {"d": [[k, v], ..]} dict (and defaultdict; in insertion order), {"ctr": [[k, v], ..]}
    Counter, {"o": [[k, v], ..]} OrderedDict, {"q": [..]}
    deque, {"c": [re, im]} complex, {"b": hex} bytes, {"x": hex} an int past 13,000 bits,
    {"f": "inf"|"-inf"|"nan"} non-finite float, {"fr": [p, q]} Fraction, {"dec": text} Decimal.
    Any other type (a subclass of int with its own `__eq__`, an instance of the program's own
    class) is `handle(value)`'s encoding where `handle` is given, else raises NotPlain."""
    if depth > 100:
        raise NotPlain("nested more than 100 deep")
    t = _type(value)
    if t is int and value.bit_length() > 13_000:      # past ~3,900 digits: hex, linear both ways
        return {"x": format(value, "x")}
    if t is bool or t is int or t is str or value is None:
        return value
    if t is float:
        if value != value or value in (float("inf"), float("-inf")):
            return {"f": repr(value)}
        return value
    if t is list:
        return [encode(v, depth + 1, handle) for v in value]
    if t is tuple or (issubclass(t, tuple) and _named_tuple(t)):
        return {"t": [encode(v, depth + 1, handle) for v in _tuple_iter(value)]}
    if t is set or t is frozenset:
        items = [encode(v, depth + 1, handle) for v in value]
        items.sort(key=lambda e: json.dumps(e, sort_keys=True))
        return {"s": items} if t is set else {"fs": items}
    if t is dict or t is _COUNTER or t is _DEFAULT:    # in insertion order, which programs may read
        pairs = [[encode(k, depth + 1, handle), encode(v, depth + 1, handle)] for k, v in _dict_items(value)]
        return {"d" if t is not _COUNTER else "ctr": pairs}
    if t is _ORDERED:
        return {"o": [[encode(k, depth + 1, handle), encode(v, depth + 1, handle)] for k, v in _dict_items(value)]}
    if t is _DEQUE:
        return {"q": [encode(v, depth + 1, handle) for v in value]}
    if t is complex:
        return {"c": [value.real, value.imag]}
    if t is bytes:
        return {"b": value.hex()}
    if t is _FRACTION:
        return {"fr": [value.numerator, value.denominator]}
    if t is _DECIMAL:
        return {"dec": str(value)}
    if handle is not None:
        return handle(value)
    raise NotPlain(f"a value of type {t.__module__}.{t.__qualname__}")


def decode(data, handles=None):
    """The inverse of `encode`, building fresh built-in objects; malformed data raises ValueError.
    `handles` (the program's side only) turns {"h": id} into the object it stands for."""
    if isinstance(data, list):
        return [decode(v, handles) for v in data]
    if not isinstance(data, dict):
        if data is None or type(data) in (bool, int, float, str):
            return data
        raise ValueError(f"not encoded data: {type(data).__name__}")
    if len(data) != 1:
        raise ValueError("an encoded value has one tag")
    (tag, body), = data.items()
    try:
        return _decode_tagged(tag, body, handles)
    except (TypeError, ArithmeticError, KeyError, IndexError, decimal.InvalidOperation) as e:
        raise ValueError(f"malformed {tag!r} value ({type(e).__name__})") from None


def _decode_tagged(tag, body, handles):
    if tag == "h" and handles is not None:
        return handles[body]
    if tag in ("t", "s", "fs", "q") and not isinstance(body, list):
        raise TypeError(tag)
    if tag == "t":
        return tuple(decode(v, handles) for v in body)
    if tag in ("s", "fs"):
        items = [decode(v, handles) for v in body]
        _spread_hashes(items)
        return set(items) if tag == "s" else frozenset(items)
    if tag in ("d", "o", "ctr"):
        pairs = [(decode(k, handles), decode(v, handles)) for k, v in body]
        _spread_hashes([k for k, _ in pairs])
        if tag == "ctr":
            return collections.Counter(dict(pairs))
        return dict(pairs) if tag == "d" else collections.OrderedDict(pairs)
    if tag == "q":
        return collections.deque(decode(v, handles) for v in body)
    if tag == "c":
        re_, im = body
        if type(re_) not in (int, float) or type(im) not in (int, float):
            raise TypeError(tag)
        return complex(re_, im)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "x":
        if type(body) is not str or len(body) > 1 << 24:
            raise TypeError(tag)
        return int(body, 16)
    if tag == "f":
        if body not in ("inf", "-inf", "nan"):
            raise TypeError(tag)
        return float(body)
    if tag == "fr":
        p, q = body
        if type(p) is not int or type(q) is not int:
            raise TypeError(tag)
        return fractions.Fraction(p, q)            # q == 0 raises ZeroDivisionError: malformed
    if tag == "dec":
        value = decimal.Decimal(body)
        if value.is_snan():
            raise TypeError(tag)                    # a signalling NaN raises when compared
        return value
    raise ValueError(f"unknown tag {tag!r}")


SHARED_HASH_LIMIT = 16    # keys of one set or dict that may share a hash value


def _spread_hashes(keys) -> None:
    """Refuse keys of which more than SHARED_HASH_LIMIT share one hash: a set or dict of n such
    keys takes n * n / 2 comparisons to build (40,000 integers k * (2**61 - 1), which all hash
    to 0, take 20 s). Sorted, not counted in a dict, whose own hashing the program would choose."""
    hashes = sorted(hash(k) for k in keys)           # an unhashable key raises TypeError: malformed
    run = 1
    for before, after in zip(hashes, hashes[1:]):
        run = run + 1 if before == after else 1
        if run > SHARED_HASH_LIMIT:
            raise ValueError(f"more than {SHARED_HASH_LIMIT} keys share one hash")


class Unhashed:
    """A set, frozenset, dict (defaultdict, Counter, OrderedDict) or deque that came back from the
    program, as the list of its elements (of its (key, value) pairs for a mapping), never built:
    building it would hash keys the program chose. `same` compares it; `==` is refused."""

    __slots__ = ("kind", "items")
    __hash__ = None

    def __init__(self, kind: str, items: list):
        self.kind, self.items = kind, items

    def __eq__(self, other):
        raise TypeError("compare values that came back with same(), not ==")

    __ne__ = __eq__

    def __repr__(self):
        return f"Unhashed({self.kind!r}, {self.items!r})"


_HASHED = {"s": "set", "fs": "frozenset", "d": "dict", "o": "dict", "ctr": "dict", "q": "deque"}


def decode_unhashed(data, depth=0):
    """`decode` for the trainer, linear in the size of `data`: lists, tuples and scalars as
    `decode` builds them, sets, mappings and deques as `Unhashed`. Malformed data (a key that no
    real set or dict could hold among them) raises ValueError, as in `decode`."""
    if depth > 101:
        raise ValueError("nested more than 100 deep")
    if type(data) is list:
        return [decode_unhashed(v, depth + 1) for v in data]
    if type(data) is not dict or len(data) != 1:
        return decode(data)                          # a scalar, or malformed: decode says which
    (tag, body), = data.items()
    if tag == "t" and type(body) is list:
        return tuple(decode_unhashed(v, depth + 1) for v in body)
    if tag not in _HASHED:
        return decode(data)
    if type(body) is not list or (_HASHED[tag] == "dict" and not all(
            type(pair) is list and len(pair) == 2 for pair in body)):
        raise ValueError(f"malformed {tag!r} value")
    if _HASHED[tag] != "dict":
        items = [decode_unhashed(v, depth + 1) for v in body]
    else:
        items = [(decode_unhashed(k, depth + 1), decode_unhashed(v, depth + 1)) for k, v in body]
    if _HASHED[tag] != "deque" and not all(
            _key_shaped(k) for k in (items if _HASHED[tag] != "dict" else (k for k, _ in items))):
        raise ValueError(f"malformed {tag!r} value (an unhashable key)")
    return Unhashed(_HASHED[tag], items)


def _key_shaped(value) -> bool:
    """Whether a real set or dict could hold `value` (as `decode_unhashed` gives it) as a key."""
    if type(value) is tuple:
        return all(_key_shaped(v) for v in value)
    if type(value) is Unhashed:
        return value.kind == "frozenset"
    return type(value) is not list


def same(got, expected) -> bool:
    """Python's `got == expected`, where `got` came back from the program (`decode_unhashed`'s
    form, or a plain value) and `expected` is the row's own value (a literal, a JSON value). Time
    is linear in the size of `got` (and of `expected`): a set or mapping that came back is matched
    against `expected`'s hash table, one lookup per element, and never built. A set or mapping
    nested as a key matches nothing (no literal key holds one)."""
    if type(got) is not Unhashed and isinstance(got, (set, frozenset, dict, _DEQUE)):
        got = _unhashed(got)
    if type(got) is Unhashed:
        return _same_unhashed(got, expected)
    if type(got) in (list, tuple) or isinstance(got, tuple):
        kind = list if type(got) is list else tuple
        return (isinstance(expected, kind) and len(got) == len(expected)
                and all(same(g, e) for g, e in zip(got, expected)))
    if isinstance(expected, (list, tuple, set, frozenset, dict, _DEQUE)):
        return False
    try:
        return bool(got == expected)
    except Exception:  # noqa: BLE001 - values that cannot be compared
        return False


def _unhashed(value) -> Unhashed:
    if isinstance(value, dict):
        return Unhashed("dict", list(value.items()))
    kind = "deque" if isinstance(value, _DEQUE) else "set" if isinstance(value, set) else "frozenset"
    return Unhashed(kind, list(value))


def _same_unhashed(got: Unhashed, expected) -> bool:
    if got.kind == "deque":
        return (isinstance(expected, _DEQUE) and len(got.items) == len(expected)
                and all(same(g, e) for g, e in zip(got.items, expected)))
    mapping = got.kind == "dict"
    if not isinstance(expected, dict if mapping else (set, frozenset)) \
            or len(got.items) != len(expected):
        return False
    index = {key: k for k, key in enumerate(expected)}       # the row's keys: its own hashing
    values = list(expected.values()) if mapping else None
    matched = set()
    for item in got.items:
        key = item[0] if mapping else item
        try:
            k = index.get(key)
        except TypeError:                            # a key holding a set: no literal key does
            return False
        if k is None or k in matched:                # two copies of one key: no real set has them
            return False
        matched.add(k)
        if mapping and not same(item[1], values[k]):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# `tests`: the program in a process of its own, the tests here

_HEADER = 4
MESSAGE_CAP = 32 << 20              # a reply larger than this is refused (a flood, not a result)


def _send_message(fd, payload) -> None:
    data = json.dumps(payload).encode()
    data = len(data).to_bytes(_HEADER, "big") + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd, n):
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_message(fd):
    """The next message, or None when the other side has gone or sent something unreadable."""
    header = _read_exact(fd, _HEADER)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > MESSAGE_CAP:
        return None
    body = _read_exact(fd, size)
    try:
        return None if body is None else json.loads(body)
    except (ValueError, RecursionError):
        return None


def _defines(code: str, name: str) -> bool:
    """Whether `code` defines `name` at its top level (a function, a class or an assignment)."""
    import ast
    import re
    try:
        tree = ast.parse(code)
    except Exception:  # noqa: BLE001 - SyntaxError, and RecursionError on deep nesting
        return re.search(rf"^[ \t]*def[ \t]+{re.escape(name)}[ \t]*\(", code, re.MULTILINE) is not None
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
               for n in tree.body) or any(isinstance(n, ast.Assign) and any(
                   isinstance(t, ast.Name) and t.id == name for t in n.targets) for n in tree.body)


def _attribute_bases(*sources: str):
    """The names whose attributes `sources` read (`math` in `math.isclose(...)`), which the tests
    therefore use as modules; every name, as far as anyone asks, when a source does not parse."""
    import ast

    class Everything:
        def __contains__(self, name):
            return True
    bases = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except Exception:  # noqa: BLE001 - SyntaxError, RecursionError: fail closed
            return Everything()
        bases.update(node.value.id for node in ast.walk(tree)
                     if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name))
    return bases


def program_process(requests: int, replies: int) -> None:
    """The program's side of `tests`: load the program, then answer the tests' requests until
    they stop. Forked before the job was read; runs the program's code and nothing of the tests."""
    objects = {}

    def reply_value(value):
        try:
            return {"v": encode(value)}
        except (NotPlain, RecursionError):
            objects[len(objects) + 1] = value
            return {"h": len(objects)}

    def reply_raised(e):
        kind = type(e)
        name = kind.__name__ if getattr(builtins, kind.__name__, None) is kind else "program"
        return {"raised": name}

    job = _read_message(requests)
    if job is None:
        os._exit(0)
    code, entry = job["code"], job.get("entry")
    if entry and job.get("helpers") and not _defines(code, entry):
        code = job["helpers"] + "\n" + job["completion"]   # a base model continuing the signature
    program = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(code, "<completion>", "exec"), program)
    except BaseException as e:  # noqa: BLE001 - anything the program raises, SystemExit included
        _send_message(replies, {"error": f"the program raised {type(e).__name__} before the tests"})
        os._exit(0)
    names = {}
    for name, value in list(program.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            names[name] = {"module": getattr(value, "__name__", "")}
        elif callable(value):
            objects[len(objects) + 1] = value
            names[name] = {"h": len(objects)}
        else:
            names[name] = reply_value(value)
    _send_message(replies, {"names": names})
    ops = {"call": lambda ref, q: ref(*decode(q["args"], objects), **decode(q["kwargs"], objects)),
           "getattr": lambda ref, q: getattr(ref, q["name"]), "iter": lambda ref, q: iter(ref),
           "next": lambda ref, q: next(ref), "len": lambda ref, q: len(ref),
           "getitem": lambda ref, q: ref[decode(q["key"], objects)]}
    while True:
        request = _read_message(requests)
        if request is None:
            os._exit(0)
        try:
            out = reply_value(ops[request["op"]](objects[request["ref"]], request))
        except StopIteration:
            out = {"stop": True}          # the end of an iteration (the tests' side says whose)
        except BaseException as e:  # noqa: BLE001 - the program's exception, SystemExit included
            out = reply_raised(e)
        _send_message(replies, out)


class ProgramError(Exception):
    """The program raised an exception that is not one of the builtins (or SystemExit)."""


class ProgramGone(BaseException):
    """The program's process ended, or answered something unreadable: the run scores 0."""


class Untrusted(Exception):
    """A handle to one of the program's objects was compared or tested for truth."""


class Link:
    """The tests' end of the pipes to the program's process."""

    def __init__(self, requests: int, replies: int, flags: list):
        self.requests, self.replies, self.flags = requests, replies, flags

    def ask(self, **request):
        try:
            _send_message(self.requests, request)
        except OSError:
            self.gone("the program's process ended")
        reply = _read_message(self.replies)
        if not isinstance(reply, dict):
            self.gone("the program's process ended or answered something unreadable")
        return reply

    def gone(self, why: str):
        if not self.flags:
            self.flags.append(why)
        raise ProgramGone(why)

    def value(self, reply, iterating=False):
        """A reply as what the tests see: a fresh plain value, a handle, or the exception. The end
        of an iteration counts only as the answer to `next`; a StopIteration the program raises
        anywhere else would end the tests' own loops (`all(map(candidate, xs))`) early."""
        if "v" in reply:
            try:
                return decode(reply["v"])
            except (ValueError, RecursionError):
                self.gone("the program returned a malformed value")
        if type(reply.get("h")) is int:
            return Remote(self, reply["h"])
        if "stop" in reply and iterating:
            raise StopIteration
        name = reply.get("raised")
        kind = getattr(builtins, name, None) if isinstance(name, str) else None
        if isinstance(kind, type) and issubclass(kind, Exception) \
                and not issubclass(kind, (StopIteration, StopAsyncIteration)):
            raise kind("raised by the program")
        raise ProgramError(f"the program raised {name!r}")

    def encode_args(self, value):
        """Arguments as plain data; a handle, anywhere in them, goes back as itself."""
        try:
            return encode(value, handle=self._handle)
        except (NotPlain, RecursionError) as e:
            raise TypeError(f"the tests passed {e} to the program; only plain values and the "
                            "program's own objects can be passed") from None

    def _handle(self, value):
        if type(value) is Remote and value._link is self:
            return {"h": value._ref}
        raise NotPlain(f"a value of type {type(value).__module__}.{type(value).__qualname__}")


class Remote:
    """One of the program's objects, as the tests see it: it may be called, its attributes read,
    iterated, measured and indexed (each a request to the program's process, answered with a fresh
    plain value or another handle); it may not be compared, hashed or tested for truth."""

    __slots__ = ("_link", "_ref")

    def __init__(self, link: Link, ref: int):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_ref", ref)

    def __call__(self, *args, **kwargs):
        link = self._link
        return link.value(link.ask(op="call", ref=self._ref, args=link.encode_args(list(args)),
                                   kwargs=link.encode_args(kwargs)))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._link.value(self._link.ask(op="getattr", ref=self._ref, name=name))

    def __iter__(self):
        it = self._link.value(self._link.ask(op="iter", ref=self._ref))
        if type(it) is not Remote:
            raise TypeError("the program's iterator is not an iterator")
        return RemoteIterator(it)

    def __len__(self):
        n = self._link.value(self._link.ask(op="len", ref=self._ref))
        if type(n) is not int or n < 0:
            raise TypeError("the program's len() is not a length")
        return n

    def __getitem__(self, key):
        return self._link.value(self._link.ask(op="getitem", ref=self._ref,
                                               key=self._link.encode_args(key)))

    def _refuse(self, *_):
        self._link.flags.append("the tests compared, hashed or tested the truth of one of the "
                                "program's objects (not a plain value)")
        raise Untrusted("not a plain value")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __bool__ = _refuse
    __contains__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __abs__ = __neg__ = __float__ = __int__ = __index__ = _refuse
    __str__ = __repr__ = lambda self: f"<the program's object {self._ref}>"

    def __setattr__(self, name, value):
        raise TypeError("the tests cannot change the program's objects from here")


class RemoteIterator:
    def __init__(self, remote: Remote):
        self.remote = remote

    def __iter__(self):
        return self

    def __next__(self):
        link = self.remote._link
        return link.value(link.ask(op="next", ref=self.remote._ref), iterating=True)


def start_program_process():
    """Fork the program's process; it keeps only its two pipe ends, and /dev/null on 0, 1, 2.
    Returns (requests write end, replies read end) for the tests' side, and its pid."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            quiet = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(quiet, fd)
            keep = {0, 1, 2, req_r, rep_w}
            for fd in range(3, 256):
                if fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            sys.stdin = io.StringIO("")
            program_process(req_r, rep_w)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(rep_w)
    return req_w, rep_r, pid


def run_tests(job, send, link_fds):
    """The `tests` mode: the program in its own process (started by main()), then the dataset's
    rewritten test program here.
    Longer than about 60 lines: the tests' process from fork to its one result line, in the order
    the isolation needs (fork the program, drop privileges, read the job, answer calls); helpers
    would pass the descriptors around."""
    flags: list = []
    records = {"lit": {}, "ran": {}}
    link = Link(*link_fds, flags)
    entry = job.get("entry_point")
    try:
        names = link.ask(code=job["code"], completion=job.get("completion", ""),
                         helpers=job.get("helpers", ""), entry=entry)
    except ProgramGone:
        return send({"flags": flags, **records})
    if not isinstance(names.get("names", names.get("error")), (dict, str)):
        flags.append("the program's process ended before the tests")
        return send({"flags": flags, **records})
    if "error" in names:
        flags.append(str(names["error"])[:200])
        return send({"flags": flags, **records})
    tests = {"__name__": "__main__", "__builtins__": builtins}
    read_as_modules = _attribute_bases(job["test"], job.get("helpers", ""))
    for name, what in names["names"].items():
        if not isinstance(name, str) or not isinstance(what, dict) or name.startswith("__") \
                or not name.isidentifier():
            continue         # `__name__`, `__builtins__` and the recorders are the tests' own
        if name in vars(builtins) and name != entry:
            continue         # the program's own `abs` or `set` never stands in for the builtin
        if name in sys.stdlib_module_names and ("module" in what or name in read_as_modules):
            # a module's name that the tests use as a module (`math.isclose`) is only ever the
            # real module, imported here: never the program's class or value of that name (a
            # `class math` answering `isclose`); one they only call (`token(s)`) is the program's
            if "module" in what and what["module"] == name and name not in ("antigravity", "this"):
                try:
                    tests[name] = __import__(name)
                except BaseException:  # noqa: BLE001
                    pass
            continue
        if "module" in what:
            continue
        try:
            tests[name] = link.value(what)
        except (ProgramGone, ProgramError, StopIteration, Exception):
            if flags:
                return send({"flags": flags, **records})
    if entry and type(tests.get(entry)) is not Remote:
        flags.append(f"the program defines no function {entry!r}")
        return send({"flags": flags, **records})

    caps = job.get("lit_caps") or {}

    def lit(index, value):
        try:
            encoded = encode(value)
        except (NotPlain, RecursionError) as e:
            flags.append(f"assert {index} compared {e}")
            raise AssertionError(index) from None
        cap = caps.get(str(index))
        if type(cap) is int and len(json.dumps(encoded)) > cap:
            # far larger than the literal it is compared with (the trainer sized the cap from
            # it): a failed assert, never sent, so the trainer never spends time reading it
            raise AssertionError(index)
        records["lit"].setdefault(str(index), []).append(encoded)

    def ran(index, ok):
        count = records["ran"].setdefault(str(index), [0, 0])
        count[0] += 1
        if not ok:
            count[1] += 1
            raise AssertionError(index)

    def eq(index, left, right):
        try:
            same = bool(left == right)
        except Untrusted:
            raise AssertionError(index) from None
        except Exception:  # noqa: BLE001 - values that cannot be compared (a signalling NaN)
            same = False
        ran(index, same)

    def truth(index, value):
        try:
            ok = bool(value)
        except Untrusted:
            raise AssertionError(index) from None
        ran(index, ok)

    tests.update({"__grpo_lit__": lit, "__grpo_eq__": eq, "__grpo_truth__": truth})
    try:
        if job.get("helpers"):
            exec(compile(job["helpers"], "<prompt>", "exec"), tests)
        if entry:
            tests[entry] = link.value(names["names"][entry])
        exec(compile(job["test"], "<tests>", "exec"), tests)
        if job.get("check"):
            tests[job["check"]](tests[entry])
        records["done"] = True
    except BaseException as e:  # noqa: BLE001 - a failed assert, or the program's exception
        records["raised"] = type(e).__name__
    send({"flags": flags, **records})


def _add_exit_names():
    """`exit` and `quit` as a normal interpreter has them (`-S` skips site, which defines them)."""
    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, sys.exit)


def run_calls(job, send):
    """The `calls` mode: the program once, then fn(*args) per case; results go back encoded."""
    program = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(job["code"], "<completion>", "exec"), program)
    except BaseException as e:  # noqa: BLE001
        return send({"error": f"the program raised {type(e).__name__}"})
    fn = program.get(job["fn_name"])
    if fn is None:
        # LeetCode style: the function is a method of a class named Solution.
        holder = program.get("Solution")
        fn = getattr(holder(), job["fn_name"], None) if isinstance(holder, type) else None
    if not callable(fn):
        return send({"error": f"the program defines no function {job['fn_name']!r}"})
    results = []
    for args in job["calls"]:
        try:
            results.append({"value": encode(fn(*args))})
        except (NotPlain, RecursionError) as e:
            results.append({"error": f"returned {e}"})
        except BaseException as e:  # noqa: BLE001
            results.append({"error": type(e).__name__})
            if not job.get("all_cases"):
                break
        if "error" in results[-1] and not job.get("all_cases"):
            break
    send({"results": results})


def run_stdio(job, send):
    """The `stdio` mode: each case in a forked child; this process never runs the program.
    Longer than about 60 lines: one forked child per case, its descriptors set up in order before
    the completion runs."""
    import signal
    import time
    try:  # the cases' processes, of the same user id, cannot open our descriptors or memory
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)       # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError, ImportError):
        pass
    code = compile(job["code"], "<completion>", "exec") if _compiles(job["code"]) else None
    results = []
    for index, given in enumerate(job["inputs"]):
        if code is None:
            results.append({"error": "SyntaxError"})
            break
        in_path, out_path = f"/tmp/.case-{index}-in", f"/tmp/.case-{index}-out"
        with open(in_path, "w") as f:
            f.write(given)
        pid = os.fork()
        if pid == 0:  # the child: the case's input on fd 0, its output to a file, nothing else open
            status = 1
            try:
                os.setpgid(0, 0)
                os.dup2(os.open(in_path, os.O_RDONLY), 0)
                os.dup2(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
                os.closerange(3, 1 << 16)
                sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
                sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
                sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False))
                try:
                    exec(code, {"__name__": "__main__", "__builtins__": builtins})
                    status = 0
                except SystemExit as e:
                    status = 0 if e.code in (0, None) else 1
                except BaseException:  # noqa: BLE001
                    pass
                import atexit
                atexit._run_exitfuncs()          # fast-IO templates write their buffer at exit
                for stream in (sys.stdout, sys.__stdout__):
                    stream.flush()
            finally:
                os._exit(status)
        deadline = time.monotonic() + job["timeout_s"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = None
                break
            time.sleep(0.002)
        if job.get("isolated"):  # anything the case left running under this user id goes too
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        cut = False
        try:
            with open(out_path, "rb") as f:
                out = f.read(job["output_cap"]).decode("utf-8", "replace")
                cut = os.fstat(f.fileno()).st_size > job["output_cap"]
        except OSError:
            out = ""
        for path in (in_path, out_path):
            try:
                os.remove(path)
            except OSError:
                pass
        if status is None:
            results.append({"error": "timeout"})
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            results.append({"out": out, **({"cut": True} if cut else {})})
        else:
            results.append({"error": f"exit status {status}"})
        if "error" in results[-1] and not job.get("all_cases"):
            break
    send({"results": results})


def _compiles(code):
    try:
        compile(code, "<completion>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def main():
    # In `tests` mode (the launcher's argument), the program's process first, before the job (and
    # its nonce and tests) is read: what it holds is this file's source and, later, the program's
    # code; nothing else of this process.
    link = start_program_process() if sys.argv[1:] == ["tests"] else None
    try:  # a process of the same user id cannot read our memory or descriptors
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)       # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError, ImportError):
        pass
    import signal
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM, signal.SIGQUIT):      # a signal from the program interrupts nothing
        signal.signal(sig, signal.SIG_IGN)
    job = json.loads(sys.stdin.readline())
    nonce = job.pop("nonce").encode()
    result_fd = os.dup(1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    sys.stdin = io.StringIO("")
    _add_exit_names()
    write, dumps, exit_now, kill, reap = os.write, json.dumps, os._exit, os.kill, os.waitpid

    def send(payload):
        write(result_fd, nonce + dumps(payload).encode() + b"\n")
        if link is not None:     # the program's process goes now, not when the launcher looks
            try:
                kill(link[2], signal.SIGKILL)
                reap(link[2], 0)
            except OSError:
                pass
        exit_now(0)

    if job["mode"] == "tests":
        if link is None:
            return send({"flags": ["the harness was not started for the tests mode"]})
        return run_tests(job, send, link[:2])
    {"calls": run_calls, "stdio": run_stdio}[job["mode"]](job, send)


if __name__ == "__main__":
    main()
