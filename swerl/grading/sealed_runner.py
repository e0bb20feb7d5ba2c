"""The sealed test runner: runs a task's tests inside the grading sandbox and reports results code under test cannot
forge.

This file is never imported by swerl: its source is sent to the sandbox as
`python -I -c SOURCE MODE KEYFILE TOUCHED -- IDS...` (swerl/grading/grader.py; TOUCHED the JSON list of the files the
graded patch changed: the policy's reach), so nothing the policy's patch can touch decides how results are collected.

What holds for every mode:
- `-I`: no PYTHON* variables, no user site-packages, the workspace not on sys.path while the runner sets up.
- The result key is read from KEYFILE and the file removed before any workspace code runs. The key, the results and
  the problems found live only in the closure of an audit hook (`sys.addaudithook`: hooks cannot be removed and no
  Python object refers to them), which receives the runner's events through `sys.audit("swerl.*", ...)` and accepts
  an event only from the runner's own code objects, on the main thread, with no frame of a file the patch touched
  on the stack (a forged call through pytest's hooks, a finalizer or a thread is refused and recorded). At the end
  the hook writes every result as `@@swerl-result MAC PAYLOAD` and `@@swerl-end MAC SUMMARY` (MAC an HMAC-SHA256
  under the key) and ends the process with os._exit: printed `PASSED` lines, fake records and atexit handlers of
  code under test count for nothing; a run that ends before the end record (os._exit, a crash, a kill) is incomplete.
- The same hook denies the ways into the runner's frames and objects to code in the files the patch touched:
  sys._getframe and the frame attributes of tracebacks, generators and coroutines (directly or through inspect,
  traceback and logging helpers that hand frames back), sys._current_frames, gc's object walks, tracers and
  profilers, ctypes, signal handlers (they receive frames; signal.signal is wrapped), code objects built or
  compiled under another file's name. A denied call raises in the caller and is recorded as tampering.
- The test machinery (pytest, pluggy, unittest, builtins, os, sys, the import system, signal) and the test modules
  are fingerprinted before the tests run and checked after every test and at the end: a replaced runner, report,
  hook caller, builtin or test helper, an import hook or tracer planted by the patch's code, is tampering. Import
  hooks and plugins count only when they live in a file the patch changed: real repositories install their own.

MODE `unittest` (the task's own Django tests/runtests.py or `python -m unittest` command): see _unittest_mode.
MODE `pytest` (the repository's pytest suite): installed plugins are loaded from the environment's own metadata
before the workspace is on sys.path (autoloading is then off, so `*.dist-info` the agent writes into the workspace
is never read), the configuration file must not be one the patch changed, every plugin registration and every hook
implementation called is checked, and each test's reports must arrive once per phase, inside its own
logstart/logfinish window, in collection order. MODE `micro` (swerl's micro repositories: every `test_*` function of
tests/test_*.py is `check(CALL, EXPECTED)`): the tests run in a child process with no key, which sends back only the
value each CALL returned, encoded as plain data (exact builtin types; anything else fails the test); this process
compares it with EXPECTED read from the pristine test file. Nothing the code under test does in its process decides
a verdict: it can only return values.

Limits, said plainly: in pytest mode the tests run in the same process as the code they test; the hook raises the
bar (every route above is closed or recorded) but a route nobody has listed yet may exist, so each grading change
is followed by a new red-team attempt (docs/architecture.md, "Grading"). A policy that reads the visible tests and
returns their expected values for their inputs passes in every mode: only hidden tests catch that.
"""

from swerl.grading.sealed_hook import (
    _install_hook,
    _undumpable,
)
from swerl.grading.sealed_micro import (
    _micro_child,
    _micro_parent,
)
from swerl.grading.sealed_unittest import (
    _unittest_mode,
)


def _main():  # everything lives in this function's locals and the hook's closure: __main__ holds nothing to replace
    # Over 60 lines: a sealed-runner part whose state lives in its locals on purpose (see the module docstring).
    import builtins
    import importlib
    import importlib.util
    import json
    import os
    import signal
    import sys
    import threading
    import unittest

    argv = sys.argv[1:]
    if argv[3:4] != ["--"]:
        raise SystemExit("usage: MODE KEYFILE TOUCHED_JSON -- IDS...")
    mode, keyfile, ids = argv[0], argv[1], argv[4:]
    if mode == "micro-child":
        return _micro_child(int(keyfile), json.loads(argv[2]))
    touched_lines = {os.path.normpath(p): v for p, v in json.loads(argv[2]).items()}
    touched = frozenset(touched_lines)
    with open(keyfile, "rb") as keyhandle:
        key = keyhandle.read()
    os.unlink(keyfile)
    _undumpable()
    workspace = os.getcwd()
    audit = sys.audit

    machinery = [
        builtins,
        os,
        sys,
        unittest,
        unittest.case,
        importlib,
        importlib.util,
        json,
        signal,
        threading,
    ]
    plugin_modules = []
    if mode == "pytest":
        import _pytest.config
        import pluggy
        import pytest

        for name in _pytest.config.default_plugins:
            try:
                importlib.import_module("_pytest." + name)
            except ImportError:  # noqa: SIM105 - contextlib is not machinery the runner needs
                continue
        # The environment's installed plugins, read while the workspace is not on sys.path: metadata the agent
        # writes into the workspace (a `*.dist-info/entry_points.txt` with a pytest11 entry) is never seen. pytest
        # imports them (`-p`) before the workspace is put on sys.path, so a workspace module cannot shadow one.
        try:
            import importlib.metadata as metadata
        except ImportError:  # Python < 3.8: pytest autoloads them, before the workspace is on sys.path too
            metadata = None  # type: ignore[assignment]
        if metadata is not None:
            groups = metadata.entry_points()
            select = getattr(groups, "select", None)  # Python 3.8 and 3.9 return a dict of groups
            found = select(group="pytest11") if select else dict(groups).get("pytest11", [])
            for entry in found:
                module_name = entry.value.split(":")[0].strip()
                if module_name not in plugin_modules:
                    plugin_modules.append(module_name)
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        for name in ("PYTEST_PLUGINS", "PYTEST_ADDOPTS"):
            os.environ.pop(name, None)
        for name, module in list(sys.modules.items()):
            if name.split(".")[0] in ("_pytest", "pytest", "pluggy", "unittest"):
                machinery.append(module)
        del pluggy

    paths = {}

    def touched_path(path):
        """The workspace-relative path of `path` when it is a file the patch changed, else None."""
        if path not in paths:
            real = os.path.realpath(path) if path else ""
            rel = os.path.relpath(real, workspace) if real.startswith(workspace + os.sep) else None
            paths[path] = rel if rel in touched else None
        return paths[path]

    def in_workspace_code(obj):
        """Whether obj's defining file is a file the patch changed that is not test infrastructure (its reach)."""
        module = sys.modules.get(getattr(obj, "__module__", "") or "") if not hasattr(obj, "__file__") else obj
        rel = touched_path(getattr(module, "__file__", None) or "")
        if rel is None:
            return False  # the repository's own code, as the task ships it
        parts = rel.split(os.sep)
        name = parts[-1]
        test = any(p in ("tests", "test", "testing") for p in parts[:-1]) or name.startswith("test_")
        return not (test or name.endswith("_test.py") or name in ("conftest.py", "run_tests.py"))

    def callables(obj, objects=False):
        return {
            k: v if objects else id(v)
            for k, v in vars(obj).items()
            if callable(v) or isinstance(v, (property, classmethod))
        }

    test_modules: list = []

    def fingerprint(objects=False):
        """Scope -> name -> id (or the object itself) of every callable of the machinery and the test modules."""
        prints = {f"test module {m.__name__}": callables(m, objects) for m in test_modules}
        for module in machinery:
            name = getattr(module, "__name__", None) or repr(type(module))
            prints[name] = callables(module, objects)
            for attr, value in list(vars(module).items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    prints[f"{name}.{attr}"] = callables(value, objects)
        prints["builtins*"] = {k: v if objects else id(v) for k, v in vars(builtins).items()}
        return prints

    def rebase():
        """Take in the changes pytest and the installed plugins make at configure time (its unraisable and thread
        exception hooks, say); a change to an object from a file the patch changed stays a change."""
        for scope, names in fingerprint(objects=True).items():
            known = state["baseline"].setdefault(scope, {})
            for name, value in names.items():
                if known.get(name) != id(value) and not in_workspace_code(value):
                    known[name] = id(value)

    state: dict = {"baseline": {}, "hooks": (list(sys.meta_path), list(sys.path_hooks))}

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
        traced = (
            sys.gettrace(),
            sys.getprofile(),
            vars(threading).get("_trace_hook"),
            vars(threading).get("_profile_hook"),
        )
        if any(hook is not None for hook in traced):
            found.append("trace or profile function set")
        return found

    def report_planted():
        for problem in planted():
            audit("swerl.problem", problem)

    if mode == "pytest":
        seal_state = {"config": None}
        clean_impls: dict = {}
        items: dict = {}

        class Seal:
            @pytest.hookimpl(tryfirst=True)
            def pytest_load_initial_conftests(self, early_config):
                # Installed plugins are loaded and may adapt pytest; conftest files and the code under test come
                # next: this is the machinery the tests must leave as they found it.
                sys.path.insert(0, workspace)  # as `python -m pytest` does, now that the plugins are loaded
                machinery.extend(
                    m for n, m in list(sys.modules.items()) if n.split(".")[0] in ("_pytest", "pytest", "pluggy")
                )
                early_config.pluginmanager.add_hookcall_monitoring(self.before_hook, self.after_hook)
                machinery.extend([early_config.pluginmanager, early_config.hook])
                state["baseline"] = fingerprint()
                state["hooks"] = (list(sys.meta_path), list(sys.path_hooks))
                inipath = getattr(early_config, "inipath", None) or getattr(early_config, "inifile", None)
                if inipath is not None and touched_path(str(inipath)):
                    audit("swerl.problem", f"configuration file {inipath} was changed by the patch")

            def before_hook(self, hook_name, hook_impls, kwargs):
                # Every implementation about to be called, however it got into the hook (registered, or put in
                # the caller's list directly and taken out again before the end).
                for impl in hook_impls:
                    if clean_impls.get(id(impl)) is impl:
                        continue
                    if in_workspace_code(impl.plugin) or in_workspace_code(impl.function):
                        audit("swerl.problem", f"hook {hook_name} implemented in workspace code")
                    else:
                        clean_impls[id(impl)] = impl

            def after_hook(self, outcome, hook_name, hook_impls, kwargs):
                return None

            @pytest.hookimpl(tryfirst=True)
            def pytest_plugin_registered(self, plugin, manager):  # plugin_name: only pytest >= 8
                # Historic: called for every plugin ever registered, so one unregistered later is seen too.
                if plugin is not self and in_workspace_code(plugin):
                    audit("swerl.problem", f"pytest plugin {manager.get_name(plugin)} from workspace code")

            @pytest.hookimpl(tryfirst=True)
            def pytest_configure(self, config):
                seal_state["config"] = config

            @pytest.hookimpl(trylast=True)
            def pytest_sessionstart(self, session):
                rebase()

            @pytest.hookimpl(trylast=True)
            def pytest_collection_finish(self, session):
                modules = {id(m): m for m in (getattr(i, "module", None) for i in session.items) if m}
                test_modules.extend(modules.values())
                for item in session.items:
                    function = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
                    items[id(item)] = (item, type(item), function, getattr(function, "__code__", None))
                state["baseline"].update((f"test module {m.__name__}", callables(m)) for m in test_modules)
                audit("swerl.collected", json.dumps([item.nodeid for item in session.items]))

            @pytest.hookimpl(trylast=True)
            def pytest_sessionfinish(self, session, exitstatus):
                # The last look while pytest's own session-long changes (its unraisable and thread exception
                # hooks, legacypath's properties) are still in place, as they were at the baseline.
                report_planted()

            @pytest.hookimpl(tryfirst=True)
            def pytest_runtest_call(self, item):
                # Right before pytest calls the test: the item, its function and that function's code are the
                # ones collected (code under test that reached the session through sys.modules could have made a
                # later test's runtest a no-op, or swapped its function).
                # A method is compared by its function: pytest before 8 binds it anew to each test's instance.
                known = items.get(id(item))
                function = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
                if (
                    known is None
                    or known[0] is not item
                    or type(item) is not known[1]
                    or function is not known[2]
                    or getattr(function, "__code__", None) is not known[3]
                    or "runtest" in vars(item)
                ):
                    audit("swerl.problem", f"test {item.nodeid} changed after collection")

            @pytest.hookimpl(tryfirst=True)
            def pytest_runtest_logstart(self, nodeid, location):
                audit("swerl.start", nodeid)

            @pytest.hookimpl(trylast=True)
            def pytest_runtest_logfinish(self, nodeid, location):
                report_planted()
                audit("swerl.finish_test", nodeid)

            @pytest.hookimpl(tryfirst=True)
            def pytest_runtest_logreport(self, report):
                if getattr(report, "outcome", None) == "rerun":  # pytest-rerunfailures: the last try decides
                    return
                if report.failed:
                    status = "FAILED" if report.when == "call" else "ERROR"
                elif report.skipped:
                    status = "XFAIL" if hasattr(report, "wasxfail") else "SKIPPED"
                elif report.when == "call":
                    status = "XPASS" if hasattr(report, "wasxfail") else "PASSED"
                else:
                    status = ""
                audit("swerl.report", report.nodeid, report.when, status)

            @pytest.hookimpl(tryfirst=True)
            def pytest_collectreport(self, report):
                if report.failed:
                    audit("swerl.result", report.nodeid or "<collection>", "ERROR")

    # The code objects allowed to send the hook events: this runner's own, compiled from its -c source (a code
    # object cannot be made equal to one of these; calling one from a touched frame is refused by the stack check).
    trusted, pending = [], [f.__code__ for f in (_main, _micro_parent, _unittest_mode)]
    while pending:
        code = pending.pop()
        trusted.append(code)
        pending += [c for c in code.co_consts if isinstance(c, type(code))]
    audit = _install_hook(key, touched_path, touched_lines, tuple(trusted))
    del key
    state["baseline"] = fingerprint()
    state["hooks"] = (list(sys.meta_path), list(sys.path_hooks))

    if mode == "pytest":
        seal = Seal()
        # swerl.data.testrun.PYTEST_ARGS (this script imports no swerl; tests/grading/test_grading_plan.py keeps them
        # equal)
        args = [
            "-rA",
            "-p",
            "no:cacheprovider",
            "--color=no",
            "--tb=short",
            "-o",
            "console_output_style=classic",
        ]
        for module_name in plugin_modules:
            args += ["-p", module_name]
        try:
            status = pytest.main([*args, *ids], plugins=[seal])
        except BaseException as exc:  # noqa: BLE001 - any escape from the runner is the run's failure
            audit("swerl.problem", f"runner interrupted: {type(exc).__name__}")
            status = None
        if status is not None:
            audit("swerl.exit", int(status))
        if status is not None and int(status) == 2:  # pytest.ExitCode.INTERRUPTED (the enum: pytest >= 5)
            audit("swerl.problem", "the pytest session was interrupted")
        config = seal_state["config"]
        named: list = config.pluginmanager.list_name_plugin() if config else []
        for name, plugin in named:
            if plugin is not None and plugin is not seal and in_workspace_code(plugin):
                audit("swerl.problem", f"pytest plugin {name} from workspace code")
    elif mode == "micro":
        for node, status, text in _micro_parent(sys.executable, ids, workspace):
            audit("swerl.result", node, status)
            print(status, f"{node} - {text}" if text else node, flush=True)
    elif mode == "unittest":  # the program's argv (JSON) comes first, then the ids: see _unittest_mode

        def sealed():  # the recorder is in place: fingerprint the machinery it wraps, every unittest module
            machinery.extend(m for n, m in list(sys.modules.items()) if n.split(".")[0] in ("unittest", "runpy"))
            state["baseline"] = fingerprint()
            state["hooks"] = (list(sys.meta_path), list(sys.path_hooks))

        sys.path.insert(0, workspace)
        outcomes, found = _unittest_mode(json.loads(ids[0]), ids[1:], workspace, in_workspace_code, sealed)
        for node, status in outcomes.items():
            audit("swerl.result", node, status)
        for problem in found:
            audit("swerl.problem", problem)
    else:
        audit("swerl.problem", f"unknown runner mode {mode!r}")

    if mode != "pytest":  # pytest mode looked last at its session's end (Seal.pytest_sessionfinish)
        report_planted()
    for flush in (sys.stdout.flush, sys.stderr.flush):  # the tests' output first: records start on new lines
        try:
            flush()
        except Exception:  # noqa: BLE001, SIM105 - a closed stream only loses the human-readable log
            continue
    audit("swerl.end")
    os._exit(3)  # not reached: the hook ends the process; a hook that did not is no report


if __name__ == "__main__":
    _main()
