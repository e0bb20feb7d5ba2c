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

MODE is `pytest` (the repository's pytest suite), `micro` (swerl's micro repositories: every `test_*` function of
tests/test_*.py, one second each, the semantics of their run_tests.py without trusting the repository's copy) or
`unittest` (the task's own Django tests/runtests.py or `python -m unittest` command: _unittest_mode).

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
    elif mode == "unittest":  # the program's argv (JSON) comes first, then the ids: see _unittest_mode

        def sealed():  # the recorder is in place: fingerprint the machinery it wraps, every unittest module
            machinery.extend(
                m for n, m in list(sys.modules.items()) if n.split(".")[0] in ("unittest", "runpy")
            )
            state["baseline"] = fingerprint()
            state["hooks"] = (list(sys.meta_path), list(sys.path_hooks))

        outcomes, found = _unittest_mode(json.loads(ids[0]), ids[1:], workspace, in_workspace_code, sealed)
        results.update(outcomes)
        problems += found
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


def _unittest_mode(program, ids, workspace, in_workspace_code, sealed):
    """MODE `unittest`: the task's own unittest-style command run in this process, its outcomes recorded where the
    code under test cannot write them. Returns ({test name: status}, [problems]); `sealed()` is called once the
    recorder is installed, before any workspace code runs (the machinery's fingerprint is taken then).

    `program` is the command's argv (swerl/agent/unittest_mode.py): Django's tests/runtests.py, run through runpy
    as `python tests/runtests.py` would run it, or `python -m unittest ...`, run through unittest.main.

    - Outcomes come only from unittest's own TestResult methods, wrapped on the base class here (every result class
      reaches them through super(); one that does not reports nothing, and a test with no outcome failed). A pass
      counts only when reported inside this runner's TestCase.run of that very test, on the result object that
      run was given, at the outermost level (a test that runs a suite of its own reports to its own result, not
      to the grade); failures and skips count wherever they are reported, and a worse outcome is never undone by
      a better one. A pass reported outside its test's run is tampering.
    - Each test is named as the runner's log prints it and swebench's Django parser reads it (the docstring's
      first line where there is one, else `test_a (app.tests.T.test_a)` on Python >= 3.11), computed with
      unittest's own TestCase.__str__/shortDescription captured here, never methods a test class or the code under
      test may override.
    - Tampering: a test's method, or a TestCase or TestResult method the run goes through, whose code lives in a
      file the patch changed (replaced at run time by the code under test), a result class from such a file, and
      a result method shadowed on the instance. unittest's internal stop signal (`_ShouldStop`, which makes
      TestCase.run skip the rest of a test and still report a pass) fails the test it is raised in.
    - `--parallel N` is forced to 1: Django's parallel workers are forked processes whose results reach this one as
      pickled events replayed outside any TestCase.run, where nothing can tell them from forged ones (and
      SWE-bench runs Django with --parallel 1, so the outcomes are the ones its harness sees).
    - Where the command names no test labels, the ids' own are run (`test_a (app.tests.T.test_a)` and the older
      `test_a (app.tests.T)` -> `app.tests.T.test_a`); if an id is docstring-named (it has no label), the command
      runs as it is. runtests.py's and unittest's exit status is ignored: the outcomes decide.
    """
    import os
    import re
    import runpy
    import sys
    import traceback
    import types
    import unittest.case
    import unittest.loader
    import unittest.main
    import unittest.result
    import unittest.runner
    import unittest.suite

    base_case, base_result = unittest.case.TestCase, unittest.result.TestResult
    case_run, case_str, case_doc = base_case.run, base_case.__str__, base_case.shortDescription
    namespace = types.SimpleNamespace
    rank = {"PASSED": 0, "XFAIL": 1, "SKIPPED": 2, "FAILED": 3, "ERROR": 3}
    results, problems = {}, []
    running = []  # (test, result) of this runner's TestCase.run calls in progress, outermost first
    outer = []  # the result objects outermost runs were given
    case_names = ("run", "__call__", "debug", "_callSetUp", "_callTestMethod", "_callTearDown", "doCleanups",
                  "subTest", "__getattribute__", "__getattr__")  # fmt: skip
    result_names = ("addSuccess", "addFailure", "addError", "addSkip", "addExpectedFailure", "addUnexpectedSuccess",
                    "addSubTest", "startTest", "stopTest", "__getattribute__", "__getattr__")  # fmt: skip

    def problem(text):
        if text not in problems:
            problems.append(text)

    def name_of(test):
        if isinstance(test, base_case):
            return case_doc(test) or case_str(test)
        try:
            return str(test)  # a class or module fixture's error holder: `setUpClass (app.tests.T)`
        except Exception:  # noqa: BLE001 - a failure under any name still fails nothing that passed
            return "<unnamed>"

    def note(test, status):
        name = name_of(test)
        previous = results.get(name)
        if previous is None or rank[status] >= rank[previous]:
            results[name] = status

    def from_patch(value):
        """Whether a function (or classmethod, staticmethod) was defined in a file the patch changed."""
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        return code is not None and in_workspace_code(namespace(__file__=code.co_filename))

    def reach(obj, names, what):
        """The names among `names` that obj's class gets from code the patch changed, or obj shadows itself."""
        own = getattr(obj, "__dict__", None)
        for name in names:
            if isinstance(own, dict) and callable(own.get(name)):
                problem(f"{what}.{name} set on the instance")
            for klass in type(obj).__mro__:
                if name in vars(klass):
                    if from_patch(vars(klass)[name]):
                        problem(f"{what} {klass.__qualname__}.{name} from a file the patch changed")
                    break

    def run(self, *args, **kwargs):
        result = args[0] if args else kwargs.get("result")
        if not running and result is not None:
            if not any(r is result for r in outer):
                outer.append(result)
                for klass in type(result).__mro__:
                    if in_workspace_code(klass):
                        problem(f"result class {klass.__qualname__} from a file the patch changed")
                reach(result, result_names, "result")
            method = getattr(self, "_testMethodName", "")
            reach(self, (*case_names, method) if isinstance(method, str) else case_names, "test")
        running.append((self, result))
        try:
            return case_run(self, *args, **kwargs)
        finally:
            running.pop()

    def recorder(method, status):
        original = vars(base_result)[method]

        def recorded(self, test, *rest):
            top = running[0] if len(running) == 1 else None
            mine = not running or (top is not None and self is top[1])  # the grade's result, not a test's own
            if method == "addSuccess":
                if top is not None and self is top[1] and test is top[0]:
                    note(test, status)
                elif mine and any(self is r for r in outer):
                    problem(f"a pass reported for {name_of(test)} outside its test's run")
            elif mine and (method != "addSubTest" or rest[-1] is not None):
                note(test, status)
            return original(self, test, *rest)

        return recorded

    for method, status in (("addSuccess", "PASSED"), ("addFailure", "FAILED"), ("addError", "ERROR"),
                           ("addSkip", "SKIPPED"), ("addExpectedFailure", "XFAIL"),
                           ("addUnexpectedSuccess", "FAILED"), ("addSubTest", "FAILED")):  # fmt: skip
        setattr(base_result, method, recorder(method, status))
    base_case.run = run

    class ShouldStop(unittest.case._ShouldStop):
        def __init__(self, *args):
            if running:
                note(running[0][0], "FAILED")
            super().__init__(*args)

    unittest.case._ShouldStop = ShouldStop

    # The command: --parallel forced to 1, the ids' own labels where it names none.
    django = program[1:3] != ["-m", "unittest"]
    head, rest = (program[:1], program[1:]) if django else ([], program[3:])
    valued = (
        {"-v", "--verbosity", "--settings", "--selenium", "--selenium-hub", "--external-host", "-k", "--tag",
         "--exclude-tag", "--start-after", "--start-at", "--bisect", "--pair"}
        if django
        else {"-k", "-s", "--start-directory", "-p", "--pattern", "-t", "--top-level-directory"}
    )  # fmt: skip
    argv, labels, index = list(head), [], 0
    while index < len(rest):
        arg, following = rest[index], rest[index + 1] if index + 1 < len(rest) else ""
        index += 1
        if django and arg.split("=")[0] == "--parallel":
            index += "=" not in arg and bool(re.fullmatch(r"\d+|auto", following))  # and its optional value
            continue
        argv.append(arg)
        if (arg in valued or (arg == "--shuffle" and following.isdigit())) and following:
            argv.append(following)
            index += 1
        elif not arg.startswith("-"):
            labels.append(arg)
    if django:
        argv[1:1] = ["--parallel", "1"]
    matches = [re.fullmatch(r"(\w+) \(([\w.]+)\)", test_id) for test_id in ids]
    for match in () if labels or not all(matches) else matches:  # a docstring-named id: the whole command
        name, where = match.groups()
        label = where if where.endswith("." + name) else f"{where}.{name}"
        if label not in argv:
            argv.append(label)
    sealed()
    try:
        if django:
            script = os.path.join(workspace, argv[0])
            sys.argv = argv
            sys.path.insert(
                0, os.path.dirname(os.path.realpath(script))
            )  # `python SCRIPT` puts its folder first
            runpy.run_path(script, run_name="__main__")
        else:
            sys.argv = ["python -m unittest", *argv]
            unittest.main(module=None, argv=sys.argv, exit=False)
    except SystemExit:
        pass  # runtests.py ends with sys.exit(failures): the outcomes decide, not the status
    except Exception:  # noqa: BLE001 - a command that crashes ran no tests: they have no outcome and fail
        traceback.print_exc()
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt and the like: the run was cut short
        problem(f"runner interrupted: {type(exc).__name__}")
    return results, problems


if __name__ == "__main__":
    _main()
