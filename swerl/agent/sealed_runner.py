"""The sealed test runner: runs a task's tests inside the grading sandbox and reports results code under test cannot forge.

This file is never imported by swerl: its source is sent to the sandbox as
`python -I -c SOURCE MODE KEYFILE TOUCHED -- IDS...` (swerl/agent/grading.py; TOUCHED the JSON list of the files the
graded patch changed), so nothing the policy's patch can touch decides how results are collected:

- `-I`: no PYTHON* variables, no user site-packages, the workspace not on sys.path while the runner sets up.
- The result key is read from KEYFILE and the file removed before any workspace code runs; every result line is
  `@@swerl-result MAC STATUS NODE` and the run ends with `@@swerl-end MAC SUMMARY`, MAC an HMAC-SHA256 under
  that key computed by functions captured before the tests import anything. Lines printed by code under test (fake
  `PASSED`, fake markers, fake records) carry no valid MAC and are ignored by the grader.
- The test machinery (pytest, pluggy, unittest, builtins, os._exit, the import system, the tracer) is imported and
  fingerprinted before the workspace is put on sys.path; after the tests the fingerprint is compared, and any
  change (a monkeypatched runner, report, hook caller or builtin; an import hook, trace or profile function planted
  by the code under test; a hook implementation living in a non-test workspace file) is reported as tampering.
  Import hooks and pytest hook implementations count only when they live in a file the patch changed: real
  repositories install their own (toolz's `tlz` adds a meta_path finder), and the repository as the task ships
  it is not the policy's.
- Results are written once, after the run, with the process's own exit code computed from them; the process ends
  with os._exit, so atexit handlers planted by code under test never run. A run that exits before the end record
  (os._exit, a crash, a kill) is incomplete and scores 0.

MODE is `pytest` (the repository's pytest suite) or `micro` (swerl's micro repositories: every `test_*` function of
tests/test_*.py, one second each, the semantics of their run_tests.py without trusting the repository's copy).

Limit, said plainly: the tests run in the same process as the code they test, so code written against this runner
(walking the interpreter's frames to this file's locals, say) can still reach its state; forging needs code aimed at
swerl's grader, which the policy never sees. The grader's static checks (swerl/agent/grading.py) flag patches that
introspect the interpreter that way.
"""


def _main():  # everything lives in this function's locals: __main__ holds nothing a patch could replace
    import _hashlib
    import builtins
    import importlib
    import importlib.util
    import json
    import os
    import signal
    import sys
    import unittest

    argv = sys.argv[1:]
    if argv[3:4] != ["--"]:
        raise SystemExit("usage: MODE KEYFILE TOUCHED_JSON -- IDS...")
    mode, keyfile, ids = argv[0], argv[1], argv[4:]
    touched = {os.path.normpath(p) for p in json.loads(argv[2])}
    with open(keyfile, "rb") as keyhandle:
        key = keyhandle.read()
    os.unlink(keyfile)
    write, exit_now, dumps, digest = os.write, os._exit, json.dumps, _hashlib.hmac_digest
    out = os.dup(1)
    flushes = (sys.stdout.flush, sys.stderr.flush)
    workspace = os.getcwd()

    machinery = [builtins, os, sys, unittest, unittest.case, importlib, importlib.util, json, signal]
    if mode == "pytest":
        import _pytest.config
        import pluggy
        import pytest

        for name in _pytest.config.default_plugins:
            try:
                importlib.import_module("_pytest." + name)
            except ImportError:  # noqa: SIM105 - contextlib is not machinery the runner needs
                continue
        for name, module in list(sys.modules.items()):
            if name.split(".")[0] in ("_pytest", "pytest", "pluggy", "unittest"):
                machinery.append(module)
        del pluggy

    def callables(obj):
        return {
            k: id(v) for k, v in vars(obj).items() if callable(v) or isinstance(v, (property, classmethod))
        }

    def fingerprint():
        prints = {}
        for module in machinery:
            name = getattr(module, "__name__", "?")
            prints[name] = callables(module)
            for attr, value in list(vars(module).items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    prints[f"{name}.{attr}"] = callables(value)
        prints["builtins*"] = {k: id(v) for k, v in vars(builtins).items()}
        return prints

    def in_workspace_code(obj):
        """Whether obj's defining file is a file the patch changed that is not test infrastructure (its reach)."""
        module = (
            sys.modules.get(getattr(obj, "__module__", "") or "") if not hasattr(obj, "__file__") else obj
        )
        path = getattr(module, "__file__", None) or ""
        path = os.path.realpath(path) if path else ""
        if not path.startswith(workspace + os.sep):
            return False
        rel = os.path.relpath(path, workspace)
        if rel not in touched:
            return False  # the repository's own code, as the task ships it
        parts = rel.split(os.sep)
        name = parts[-1]
        test = any(p in ("tests", "test", "testing") for p in parts[:-1]) or name.startswith("test_")
        return not (test or name.endswith("_test.py") or name in ("conftest.py", "run_tests.py"))

    state = {"baseline": fingerprint(), "hooks": (list(sys.meta_path), list(sys.path_hooks))}
    sys.path.insert(0, workspace)  # as `python -m pytest` does, now that the machinery is loaded
    results: dict[str, str] = {}  # node -> status
    problems = []

    def planted():
        """Tampering visible now: changed machinery, import hooks or tracers from the patch's code."""
        found = []
        now = fingerprint()
        for scope, names in state["baseline"].items():
            current = now.get(scope, {})
            for name, ident in names.items():
                if current.get(name) != ident:
                    found.append(f"{scope}.{name} replaced")
        for kind, before, after in (
            ("meta_path", state["hooks"][0], sys.meta_path),
            ("path_hooks", state["hooks"][1], sys.path_hooks),
        ):
            for entry in after:
                if entry not in before and in_workspace_code(entry):
                    found.append(f"sys.{kind} hook from workspace code")
        if sys.gettrace() is not None or sys.getprofile() is not None:
            found.append("trace or profile function set")
        return found

    if mode == "pytest":
        plugin_state = {}

        class Seal:
            @pytest.hookimpl(tryfirst=True)
            def pytest_load_initial_conftests(self, early_config):
                # Installed plugins (entry points) are loaded and may adapt pytest; conftest files and the code
                # under test come next: this is the machinery the tests must leave as they found it.
                machinery.extend(
                    m
                    for n, m in list(sys.modules.items())
                    if n.split(".")[0] in ("_pytest", "pytest", "pluggy")
                )
                state["baseline"] = fingerprint()
                state["hooks"] = (list(sys.meta_path), list(sys.path_hooks))

            @pytest.hookimpl(tryfirst=True)
            def pytest_configure(self, config):
                plugin_state["config"] = config

            def pytest_runtest_logreport(self, report):
                node, when = report.nodeid, report.when
                previous = results.get(node)
                if report.failed:
                    status = "FAILED" if when == "call" else "ERROR"
                elif report.skipped:
                    status = "XFAIL" if hasattr(report, "wasxfail") else "SKIPPED"
                elif when == "call":
                    status = "XPASS" if hasattr(report, "wasxfail") else "PASSED"
                else:
                    status = None
                if previous in ("FAILED", "ERROR") or status is None:
                    return
                if previous is None or status in ("FAILED", "ERROR") or when == "call":
                    results[node] = status

            def pytest_collectreport(self, report):
                if report.failed:
                    results[report.nodeid or "<collection>"] = "ERROR"

        seal = Seal()
        args = [
            "-rA",
            "-p",
            "no:cacheprovider",
            "--color=no",
            "--tb=short",
            "-o",
            "console_output_style=classic",
        ]
        try:
            pytest.main([*args, *ids], plugins=[seal])
        except BaseException as exc:  # noqa: BLE001 - any escape from the runner is the run's failure
            problems.append(f"runner interrupted: {type(exc).__name__}")
        config = plugin_state.get("config")
        for name, plugin in config.pluginmanager.list_name_plugin() if config else ():
            if plugin is not None and plugin is not seal and in_workspace_code(plugin):
                problems.append(f"pytest plugin {name} from workspace code")
    else:
        import ast

        def alarm(signum, frame):
            raise TimeoutError("test ran over 1s")

        def describe(exc):
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return text.splitlines()[0][:160]

        signal.signal(signal.SIGALRM, alarm)
        tests, modules = {}, {}
        folder = os.path.join(workspace, "tests")
        for name in sorted(os.listdir(folder) if os.path.isdir(folder) else []):
            if name.startswith("test_") and name.endswith(".py"):
                path = f"tests/{name}"
                try:
                    with open(path) as handle:
                        tree = ast.parse(handle.read())
                except Exception:  # noqa: BLE001
                    results[path] = "ERROR"
                    continue
                for stmt in tree.body:
                    if isinstance(stmt, ast.FunctionDef) and stmt.name.startswith("test_"):
                        tests[f"{path}::{stmt.name}"] = path
        for arg in ids or list(tests):
            selected = [t for t in tests if t == arg or t.startswith(arg + "::")]
            if not selected:
                results[arg] = "ERROR"
            for node in selected:
                path = tests[node]
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
                        modules[path] = describe(exc)
                    finally:
                        signal.alarm(0)
                module = modules[path]
                if isinstance(module, str):
                    results[node], text = "ERROR", module
                else:
                    signal.alarm(1)
                    try:
                        getattr(module, node.split("::")[1])()
                        results[node], text = "PASSED", ""
                    except BaseException as exc:  # noqa: BLE001 - SystemExit in a test is its failure
                        results[node], text = "FAILED", describe(exc)
                    finally:
                        signal.alarm(0)
                print(results[node], f"{node} - {text}" if text else node, flush=True)

    problems += planted()
    code = 0 if results and all(s in ("PASSED", "XPASS") for s in results.values()) and not problems else 1

    for flush in flushes:  # the tests' own output first, so the records start on lines of their own
        try:
            flush()
        except Exception:  # noqa: BLE001, SIM105 - a closed stream only loses the human-readable log
            continue

    def record(kind, payload):
        line = f"\n{kind} {digest(key, payload.encode(), 'sha256').hex()} {payload}\n"
        write(out, line.encode())

    for seq, (node, status) in enumerate(results.items()):
        record("@@swerl-result", dumps([seq, status, node]))
    record("@@swerl-end", dumps({"results": len(results), "exit_code": code, "tampered": problems}))
    exit_now(code)


if __name__ == "__main__":
    _main()
