"""Fails when a doctest case name holds a ';', or when tests/long_cases.cmake names a case
that does not exist (run by ctest).

doctest_discover_tests reads the names into a CMake list, so a ';' splits one case into
two ctest tests whose names match no case: both "pass" having run nothing. Names are the
string literals after TEST_CASE( (adjacent literals joined), in every tests/**/*.cpp.
long_cases.cmake moves cases to the long tier by their ctest name, "<executable>:<case>";
ctest ignores a name it does not know, so a renamed case would slip into the fast tier.
"""
import pathlib
import re
import sys

CASE = re.compile(r'\bTEST_CASE(?:_TEMPLATE)?\(\s*((?:"(?:[^"\\\n]|\\.)*"\s*)+)')
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent
    bad = []
    cases = set()
    for path in sorted(root.rglob("*.cpp")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in CASE.finditer(text):
            name = "".join(LITERAL.findall(m.group(1)))
            cases.add(name)
            if ";" in name:
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path.relative_to(root.parent)}:{line}: test case name holds ';': {name}")
    long_cases = (root / "long_cases.cmake").read_text(encoding="utf-8")
    for m in re.finditer(r'^\s*"([a-z_]+):(.*)"\s*$', long_cases, re.M):
        if m.group(2) not in cases:
            bad.append(f"tests/long_cases.cmake: no test case is named {m.group(2)!r} (executable {m.group(1)})")
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} problem(s): a ';' splits a case into ctest tests that run nothing (use ','); "
              "a long case must be named exactly as its TEST_CASE")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
