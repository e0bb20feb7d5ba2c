"""The sealed runner's audit hook: where its key, results and problems live, and what it denies to code under
test (swerl/grading/sealed_runner.py's docstring says why). Part of the runner's one script: no swerl import."""


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
    # Over 60 lines: the hook's state is this closure on purpose (see above; sealed_runner.py's docstring).
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
        {
            "currentframe",
            "stack",
            "trace",
            "getouterframes",
            "getinnerframes",
            "walk_stack",
            "walk_tb",
            "<lambda>",
            "set_trace",
            "findCaller",
        }
    )
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
        if caller is None or caller.f_code not in trusted or get_ident() != main_thread or any_touched(caller):
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
                hit = frame is not None and (touched(frame) or (frame.f_back is not None and touched(frame.f_back)))
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
        "sys._getframe": "ask",
        "object.__getattr__": "ask",
        "object.__setattr__": "near",
        "sys._current_frames": "near",
        "gc.get_objects": "near",
        "gc.get_referrers": "near",
        "gc.get_referents": "near",
        "sys.settrace": "stack",
        "sys.setprofile": "stack",
        "code.__new__": "near",
        "marshal.loads": "near",
        "compile": "name",
        "ctypes.dlopen": "near",
        "ctypes.dlsym": "near",
        "ctypes.addressof": "near",
        "ctypes.cdata": "near",
        "ctypes.cdata/buffer": "near",
        "ctypes.string_at": "near",
        "ctypes.wstring_at": "near",
        "ctypes.PyObj_FromPtr": "near",
        "ctypes.call_function": "near",
        "ctypes.set_errno": "near",
        "ctypes.get_errno": "near",
    }

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
