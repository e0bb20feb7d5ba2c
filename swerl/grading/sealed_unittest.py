"""The sealed runner's `unittest` mode: Django's runtests.py or `python -m unittest` run in the runner's process
(see swerl/grading/sealed_runner.py). Part of the runner's one script: no swerl import."""


def _unittest_mode(program, ids, workspace, in_workspace_code, sealed):
    """MODE `unittest`: the task's own unittest-style command run in this process, its outcomes recorded where the
    code under test cannot write them. Returns ({test name: status}, [problems]); `sealed()` is called once the
    recorder is installed, before any workspace code runs (the machinery's fingerprint is taken then).

    `program` is the command's argv (swerl/grading/unittest_mode.py): Django's tests/runtests.py, run through runpy
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
    # Over 60 lines: a sealed-runner part whose state lives in its locals on purpose (sealed_runner.py's docstring).
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
    case_names = (
        "run",
        "__call__",
        "debug",
        "_callSetUp",
        "_callTestMethod",
        "_callTearDown",
        "doCleanups",
        "subTest",
        "__getattribute__",
        "__getattr__",
    )
    result_names = (
        "addSuccess",
        "addFailure",
        "addError",
        "addSkip",
        "addExpectedFailure",
        "addUnexpectedSuccess",
        "addSubTest",
        "startTest",
        "stopTest",
        "__getattribute__",
        "__getattr__",
    )

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

    for method, status in (
        ("addSuccess", "PASSED"),
        ("addFailure", "FAILED"),
        ("addError", "ERROR"),
        ("addSkip", "SKIPPED"),
        ("addExpectedFailure", "XFAIL"),
        ("addUnexpectedSuccess", "FAILED"),
        ("addSubTest", "FAILED"),
    ):
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
        {
            "-v",
            "--verbosity",
            "--settings",
            "--selenium",
            "--selenium-hub",
            "--external-host",
            "-k",
            "--tag",
            "--exclude-tag",
            "--start-after",
            "--start-at",
            "--bisect",
            "--pair",
        }
        if django
        else {"-k", "-s", "--start-directory", "-p", "--pattern", "-t", "--top-level-directory"}
    )
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
            sys.path.insert(0, os.path.dirname(os.path.realpath(script)))  # `python SCRIPT` puts its folder first
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
