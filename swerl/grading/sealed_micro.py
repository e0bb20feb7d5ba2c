"""The sealed runner's `micro` mode: a keyless child returns plain values, the runner judges them (see
swerl/grading/sealed_runner.py). Part of the runner's one script: no swerl import."""

from swerl.grading.sealed_hook import (
    _install_hook,
)


def _micro_parent(python, ids, workspace):
    """Yield (node, status, message) for the micro tests: the child returns values, this process judges them."""
    # Over 60 lines: a sealed-runner part whose state lives in its locals on purpose (sealed_runner.py's docstring).
    import ast
    import json
    import os
    import subprocess
    import sys
    import time

    expected, shapes, order = {}, {}, []
    folder = os.path.join(workspace, "tests")
    for name in sorted(os.listdir(folder) if os.path.isdir(folder) else []):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        path = f"tests/{name}"
        try:
            with open(path) as handle:
                tree = ast.parse(handle.read())
        except Exception as exc:  # noqa: BLE001 - an unreadable test file errs its tests
            shapes[path] = f"{type(exc).__name__}: cannot read the test file"
            order.append(path)
            continue
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name.startswith("test_"):
                node = f"{path}::{stmt.name}"
                order.append(node)
                call = stmt.body[0].value if len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Expr) else None
                if not (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == "check"
                    and len(call.args) == 2
                    and not call.keywords
                ):
                    shapes[node] = "not a micro test: its body must be check(CALL, EXPECTED)"
                    continue
                try:
                    expected[node] = ast.literal_eval(call.args[1])
                except ValueError:
                    shapes[node] = "not a micro test: EXPECTED is not a literal"
    selected = []
    for arg in ids or [n for n in order if "::" in n]:
        matches = [n for n in order if n == arg or n.startswith(arg + "::")]
        selected += matches or [arg]
    runnable = [n for n in selected if n in expected]
    values = {}
    if runnable:
        read_end, write_end = os.pipe()
        with open("/proc/self/cmdline", "rb") as handle:  # this runner's own source, passed with -c
            argv = handle.read().split(b"\0")
        source = argv[argv.index(b"-c") + 1].decode()
        child = subprocess.Popen(
            [python, "-I", "-c", source, "micro-child", str(write_end), json.dumps(runnable), "--"],
            pass_fds=(write_end,),
            stdin=subprocess.DEVNULL,
            cwd=workspace,
        )
        os.close(write_end)
        deadline = time.monotonic() + 30.0 + 5.0 * len(runnable)  # a guard only: each test has its 1 s alarm
        buffer = b""
        with os.fdopen(read_end, "rb") as pipe:
            os.set_blocking(pipe.fileno(), False)
            while time.monotonic() < deadline and len(buffer) < 4_000_000:
                try:
                    chunk = pipe.read()
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    break
                if chunk:
                    buffer += chunk
                else:
                    time.sleep(0.01)
        if child.poll() is None:
            child.kill()
        child.wait()
        for line in buffer.decode("utf-8", "replace").splitlines():
            try:
                node, kind, payload = json.loads(line)
            except Exception:  # noqa: BLE001, S112 - the child is untrusted: a bad line is no result
                continue
            if node in runnable and node not in values and kind in ("value", "error", "import"):
                values[node] = (kind, payload)
    for node in selected:
        if node not in expected:
            yield node, "ERROR", shapes.get(node, "no such test")
            continue
        kind, payload = values.get(node, ("error", "the test run ended before this test reported"))
        if kind == "import":
            yield node, "ERROR", str(payload)[:160]
        elif kind == "error":
            yield node, "FAILED", str(payload)[:160]
        else:
            try:
                actual = _decode(payload, 0)
            except Exception as exc:  # noqa: BLE001 - not plain data: the test fails
                yield node, "FAILED", f"result is not plain data ({type(exc).__name__})"
                continue
            if actual != expected[node]:
                yield node, "FAILED", f"AssertionError: got {actual!r}, expected {expected[node]!r}"[:160]
            else:
                yield node, "PASSED", ""
    sys.stdout.flush()


def _decode(encoded, depth):
    """A value the micro child encoded, rebuilt from builtin types only (the child is untrusted: strict)."""
    if depth > 64:
        raise ValueError("nested too deeply")
    tag, body = encoded[0], encoded[1] if len(encoded) > 1 else None
    if tag == "n" and len(encoded) == 1:
        return None
    if tag == "b" and type(body) is bool:
        return body
    if tag == "i" and type(body) is str and len(body) < 5000:
        return int(body)
    if tag == "f" and type(body) is str:
        return float(body)
    if tag == "s" and type(body) is str:
        return body
    if tag in ("l", "t", "S", "F") and type(body) is list:
        items = [_decode(item, depth + 1) for item in body]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d" and type(body) is list:
        return {_decode(k, depth + 1): _decode(v, depth + 1) for k, v in body}
    raise ValueError(f"bad tag {tag!r}")


def _micro_child(fd, nodes):
    """The untrusted side of micro mode: import each test module and run each test with `check` sending the
    value its CALL returned (exact builtin types only) to the parent. It holds no key and decides nothing."""
    # Over 60 lines: a sealed-runner part whose state lives in its locals on purpose (sealed_runner.py's docstring).
    import importlib.util
    import json
    import os
    import signal
    import sys

    workspace = os.getcwd()
    _install_hook(b"", lambda path: _rel_in(path, workspace), {}, ())
    sys.path.insert(0, workspace)
    write = os.write

    def send(node, kind, payload):
        write(fd, (json.dumps([node, kind, payload]) + "\n").encode())

    def encode(value, depth=0):
        kind = type(value)
        if depth > 64:
            raise TypeError("nested too deeply")
        if value is None:
            return ["n"]
        if kind is bool:
            return ["b", value]
        if kind is int:
            return ["i", str(value)]
        if kind is float:
            return ["f", repr(value)]
        if kind is str:
            return ["s", value]
        tags: dict = {list: "l", tuple: "t", set: "S", frozenset: "F"}
        if kind in tags:
            return [tags[kind], [encode(item, depth + 1) for item in value]]
        if kind is dict:
            return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
        raise TypeError(f"{kind.__qualname__} is not a plain value")

    def alarm(signum, frame):
        raise TimeoutError("test ran over 1s")

    signal.signal(signal.SIGALRM, alarm)
    modules: dict = {}
    for node in nodes:
        path, name = node.split("::", 1)
        if path not in modules:
            signal.alarm(1)
            try:
                spec = importlib.util.spec_from_file_location(path[:-3].replace("/", "."), path)
                if spec is None or spec.loader is None:
                    raise ImportError(f"cannot load {path}")
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                modules[path] = module
            except BaseException as exc:  # noqa: BLE001 - SystemExit at import is the test's error
                modules[path] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            finally:
                signal.alarm(0)
        module = modules[path]
        if isinstance(module, str):
            send(node, "import", module)
            continue
        got: list = []

        def check(actual, expected, got=got):
            got.append(actual)

        module.check = check  # type: ignore[attr-defined]
        signal.alarm(1)
        try:
            getattr(module, name)()
            sent = ["value", encode(got[0])] if len(got) == 1 else ["error", "check was not called once"]
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a test is its failure
            sent = [
                "error",
                f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__,
            ]
        finally:
            signal.alarm(0)
        send(node, *sent)
    os._exit(0)


def _rel_in(path, workspace):
    """Every workspace file but the test files counts as touched in the micro child (it holds nothing of value;
    the hook there only keeps the code under test from reading the tests' frames and expected values)."""
    import os

    if not path:
        return None
    real = os.path.realpath(path)
    if not real.startswith(workspace + os.sep) or not os.path.isfile(real):  # "<string>": this runner's code
        return None
    rel = os.path.relpath(real, workspace)
    return None if rel.startswith("tests" + os.sep) else rel
