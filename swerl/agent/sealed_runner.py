"""The sealed test runner: runs a task's tests inside the grading sandbox and reports results code under test cannot forge.

This file is never imported by swerl: its source is sent to the sandbox as
`python -I -c SOURCE MODE KEYFILE TOUCHED -- IDS...` (swerl/agent/grading.py; TOUCHED the JSON list of the files the
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


def _main():  # everything lives in this function's locals and the hook's closure: __main__ holds nothing to replace
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
        module = (
            sys.modules.get(getattr(obj, "__module__", "") or "") if not hasattr(obj, "__file__") else obj
        )
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
                    m
                    for n, m in list(sys.modules.items())
                    if n.split(".")[0] in ("_pytest", "pytest", "pluggy")
                )
                early_config.pluginmanager.add_hookcall_monitoring(self.before_hook, self.after_hook)
                machinery.extend([early_config.pluginmanager, early_config.hook])
                state["baseline"] = fingerprint()
                state["hooks"] = (list(sys.meta_path), list(sys.path_hooks))
                inipath = getattr(early_config, "inipath", None)
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
            def pytest_plugin_registered(self, plugin, plugin_name, manager):
                # Historic: called for every plugin ever registered, so one unregistered later is seen too.
                if plugin is not self and in_workspace_code(plugin):
                    audit("swerl.problem", f"pytest plugin {plugin_name} from workspace code")

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
                    obj = getattr(item, "obj", None)
                    items[id(item)] = (item, type(item), obj, getattr(obj, "__code__", None))
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
                known = items.get(id(item))
                obj = getattr(item, "obj", None)
                if (
                    known is None
                    or known[0] is not item
                    or type(item) is not known[1]
                    or obj is not known[2]
                    or getattr(obj, "__code__", None) is not known[3]
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
        if status is not None and int(status) == int(pytest.ExitCode.INTERRUPTED):
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
            machinery.extend(
                m for n, m in list(sys.modules.items()) if n.split(".")[0] in ("unittest", "runpy")
            )
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


def _undumpable():
    """PR_SET_DUMPABLE 0: processes of the same user (the micro child, anything the tests start) cannot read this
    one's memory through /proc or ptrace. Best effort: without it the key still never reaches a child."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except Exception:  # noqa: BLE001, S110
        pass


def _install_hook(key, touched_path, touched_lines, trusted):
    """Install the audit hook that holds the key, the results and the problems, and guards the runner (see the
    module docstring). Everything it uses is bound here: this frame is gone once the hook is installed."""
    import _signal
    import hashlib
    import hmac
    import json
    import os
    import signal
    import sys
    import threading

    getframe, write, exit_now, dumps = sys._getframe, os.write, os._exit, json.dumps
    hmac_new, sha256 = hmac.new, hashlib.sha256
    out = os.dup(1)
    main_thread = threading.get_ident()
    get_ident = threading.get_ident
    results: dict = {}  # node -> status
    problems: list = []
    forged = [0]
    guarded = [True]
    command_exit: list = [None]
    protocol: dict = {
        "collected": None,
        "started": set(),
        "finished": set(),
        "current": None,
        "phases": set(),
    }
    busy = [False]
    rank = {"PASSED": 0, "XPASS": 0, "XFAIL": 1, "SKIPPED": 2, "FAILED": 3, "ERROR": 3}
    cache: dict = {}
    added: dict = {}
    trusted = frozenset(trusted)
    # stdlib helpers that hand the caller a frame: the caller of one of these is who asked for it
    hand_frames = frozenset(
        {"currentframe", "stack", "trace", "getouterframes", "getinnerframes", "walk_stack", "walk_tb",
         "<lambda>", "set_trace", "findCaller"}
    )  # fmt: skip
    frame_attrs = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
    stdlib = os.path.dirname(os.__file__)

    def in_touched_file(frame):
        filename = frame.f_code.co_filename
        rel = cache.get(filename, cache)
        if rel is cache:
            rel = cache[filename] = touched_path(filename)
            lines = touched_lines.get(rel) if rel is not None else None
            added[filename] = None if lines is None else frozenset(lines)
        return rel is not None

    def touched(frame):
        """Whether the frame runs a line the patch added (a file with no line list: any of its lines): code the
        repository already had in a file the patch edited keeps its right to introspect."""
        if not in_touched_file(frame):
            return False
        lines = added[frame.f_code.co_filename]
        return lines is None or frame.f_lineno in lines

    def any_touched(frame):
        while frame is not None:
            if in_touched_file(frame):
                return True
            frame = frame.f_back
        return False

    def asker(frame):
        """Whether the code that raised an introspection event, or (through a stdlib helper that hands frames
        back) the code that called that helper, is a file the patch touched."""
        if frame is None:
            return False
        if touched(frame):
            return True
        code = frame.f_code
        return (
            code.co_name in hand_frames
            and code.co_filename.startswith(stdlib)
            and frame.f_back is not None
            and touched(frame.f_back)
        )

    def deny(event, frame):
        where = frame.f_code.co_filename if frame is not None else "?"
        problem = f"introspection denied: {event} from {os.path.relpath(where)}"
        if problem not in problems:
            problems.append(problem)
        raise RuntimeError(f"swerl's sealed runner denies {event} to code under test")

    def record(kind, payload):
        write(out, f"\n{kind} {hmac_new(key, payload.encode(), sha256).hexdigest()} {payload}\n".encode())

    def finish():
        ok = results and all(s in ("PASSED", "XPASS") for s in results.values())
        code = 0 if ok and not problems else 1
        for seq, (node, status) in enumerate(results.items()):
            record("@@swerl-result", dumps([seq, status, node]))
        summary = {
            "results": len(results),
            "exit_code": code,
            "tampered": problems,
            "forged_events": forged[0],
            "guarded": guarded[0],
            "command_exit": command_exit[0],
        }
        record("@@swerl-end", dumps(summary))
        exit_now(code)

    def merge(node, when, status):
        previous = results.get(node)
        if previous in ("FAILED", "ERROR") or not status:
            return
        if previous is None or status in ("FAILED", "ERROR") or when == "call":
            results[node] = status

    def event_from_runner(event, args, caller):
        if event == "swerl.problem":  # whoever reports a problem can only lower the grade: always taken
            if str(args[0]) not in problems:
                problems.append(str(args[0]))
            return
        if (
            caller is None
            or caller.f_code not in trusted
            or get_ident() != main_thread
            or any_touched(caller)
        ):
            forged[0] += 1
            if f"forged runner event {event}" not in problems:
                problems.append(f"forged runner event {event}")
            return
        current = protocol["current"]
        if event == "swerl.result":  # a test's worst outcome stands: a later pass never undoes a failure
            node, status = str(args[0]), str(args[1])
            if rank.get(status, 3) >= rank.get(results.get(node, ""), -1):
                results[node] = status
        elif event == "swerl.exit":  # the test program's own status (swebench 5 records the command's)
            command_exit[0] = int(args[0])
        elif event == "swerl.collected":
            if protocol["collected"] is not None:
                problems.append("collection reported twice")
            protocol["collected"] = json.loads(args[0])
        elif event == "swerl.start":
            node = args[0]
            expected = protocol["collected"] or []
            done = len(protocol["started"])
            if current is not None or node in protocol["started"]:
                problems.append(f"test {node} started twice or inside another test")
            elif done >= len(expected) or expected[done] != node:
                problems.append(f"test {node} started out of collection order")
            protocol["started"].add(node)
            protocol["current"] = node
        elif event == "swerl.finish_test":
            if current != args[0]:
                problems.append(f"test {args[0]} finished outside its run")
            protocol["finished"].add(args[0])
            protocol["current"] = None
        elif event == "swerl.report":
            node, when, status = args
            if current != node or (node, when) in protocol["phases"]:
                problems.append(f"report for {node} ({when}) outside its run or twice")
                return
            protocol["phases"].add((node, when))
            merge(node, when, status)
        elif event == "swerl.end":
            for node in protocol["collected"] or []:
                if node not in protocol["finished"]:  # collected, never run to its end
                    results.setdefault(node, "ERROR")
            finish()

    def hook(event, args):
        if busy[0]:
            return
        if event.startswith("swerl."):
            busy[0] = True
            try:
                event_from_runner(event, args, getframe(1))
            finally:
                busy[0] = False
            return
        if event not in WATCHED:
            return
        if event == "object.__getattr__" and args[1] not in frame_attrs:
            return
        if event == "object.__setattr__" and args[1] != "__code__":
            return
        busy[0] = True
        try:
            frame = getframe(1)
            rule = WATCHED[event]
            if rule == "stack":
                hit = any_touched(frame)
            elif rule == "near":
                hit = frame is not None and (
                    touched(frame) or (frame.f_back is not None and touched(frame.f_back))
                )
            elif rule == "name":  # compile(): a touched file naming its code after another file
                filename = args[1] if len(args) > 1 else ""
                hit = (
                    frame is not None
                    and touched(frame)
                    and isinstance(filename, str)
                    and os.path.isabs(filename)
                    and touched_path(filename) is None
                )
            else:
                hit = asker(frame)
            if hit:
                deny(event, frame)
        finally:
            busy[0] = False

    WATCHED = {
        "sys._getframe": "ask", "object.__getattr__": "ask", "object.__setattr__": "near",
        "sys._current_frames": "near",
        "gc.get_objects": "near", "gc.get_referrers": "near", "gc.get_referents": "near",
        "sys.settrace": "stack", "sys.setprofile": "stack", "code.__new__": "near", "marshal.loads": "near",
        "compile": "name", "ctypes.dlopen": "near", "ctypes.dlsym": "near", "ctypes.addressof": "near",
        "ctypes.cdata": "near", "ctypes.cdata/buffer": "near", "ctypes.string_at": "near",
        "ctypes.wstring_at": "near", "ctypes.PyObj_FromPtr": "near", "ctypes.call_function": "near",
        "ctypes.set_errno": "near", "ctypes.get_errno": "near",
    }  # fmt: skip

    original_signal = _signal.signal

    def guarded_signal(signalnum, handler):
        frame = getframe(1)
        if handler not in (signal.SIG_DFL, signal.SIG_IGN) and frame is not None and touched(frame):
            problems.append(f"signal handler set from {os.path.relpath(frame.f_code.co_filename)}")
            raise RuntimeError("swerl's sealed runner denies signal handlers to code under test")
        return original_signal(signalnum, handler)

    if not hasattr(sys, "addaudithook"):  # Python < 3.8 (old SWE-bench images): no guard, said in the summary
        guarded[0] = False

        def send(event, *args):
            event_from_runner(event, args, getframe(1))

        return send
    sys.addaudithook(hook)
    signal.signal = _signal.signal = guarded_signal
    return sys.audit


def _micro_parent(python, ids, workspace):
    """Yield (node, status, message) for the micro tests: the child returns values, this process judges them."""
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
                call = (
                    stmt.body[0].value if len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Expr) else None
                )
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
            pass_fds=(write_end,), stdin=subprocess.DEVNULL, cwd=workspace,
        )  # fmt: skip
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
    results: dict[str, str] = {}
    problems: list[str] = []
    running: list[tuple[object, object]] = []  # (test, result) of this runner's TestCase.runs in progress
    outer: list[object] = []  # the result objects outermost runs were given
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
    base_case.run = run  # type: ignore[method-assign]

    class ShouldStop(unittest.case._ShouldStop):  # type: ignore[name-defined,misc]
        def __init__(self, *args):
            if running:
                note(running[0][0], "FAILED")
            super().__init__(*args)

    unittest.case._ShouldStop = ShouldStop  # type: ignore[attr-defined]

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
    named = [match.groups() for match in matches if match is not None]
    # A docstring-named id has no label: the command then runs as it is.
    for name, where in () if labels or len(named) < len(ids) else named:
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
