"""The house rules of src/ (issue 40), checked on the sources (run by ctest):

- no file of src/ is over 700 lines, and the engine's files (gossip_engine.cpp, engine_*.cpp)
  are under 500;
- no algorithm's name (a string literal) appears in a file of src/ but its own: what other
  code must know of an algorithm is a flag of its registry entry;
- src/peer reads time, sleeps and waits only through a Clock (include/hearsay/clock.h), so
  that the simulator's virtual time reaches every wait: no steady_clock or system_clock, no
  this_thread::sleep_for, and no wait on a condition variable but through Clock::wait_for;
- the algorithms (src/peer/algorithms/) include nothing of site replicas, the wire, the
  transport or the engine's mailboxes: they see the engine through algorithm.h;
- the engine's own files (gossip_engine.cpp, engine_*.cpp but engine_factory.cpp, which
  composes the engine with its algorithm) include nothing of site replicas, so the engine
  calls no site code: site replicas wrap the algorithm (site_algorithm.cpp) and call the
  engine, never the other way (the circle issue 40 found);
- the synchronous phases are divided in one place (src/peer/phases.h): no line of another
  file of src/peer that names a phase shifts a 1 by 16 bits or more;
- no include circle among the headers of src/ and include/hearsay.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
MAX_LINES = 700
MAX_ENGINE_LINES = 500

TIME_CALLS = re.compile(r"\b(steady_clock|system_clock|high_resolution_clock|this_thread::sleep_for|"
                        r"this_thread::sleep_until|usleep\s*\(|nanosleep\s*\()")
# A condition variable's wait (its first argument a lock: `cv.wait(lock, ...)`,
# `cv_.wait_for(lock, ...)`) on anything but a clock.
WAIT_CALL = re.compile(r"([\w()]+)\s*(?:\.|->)\s*(wait|wait_for|wait_until)\s*\(\s*\w*lock\w*\s*[,)]")
CLOCK_RECEIVER = re.compile(r"(clock|clock_|wall|wall_clock\(\))$")
ALGORITHM_FORBIDDEN_INCLUDES = re.compile(
    r'#include\s+"(?:\.\./)?(site_[\w]*\.h|mailboxes\.h|update_guard\.h|chunked_copy\.h|'
    r'hearsay/wire\.h|hearsay/wire\.pb\.h|hearsay/transport\.h|\.\./transport/[\w/]*\.h|\.\./\.\./transport/[\w/]*\.h)"')
INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"', re.M)


def code_only(text):
    """The text without // comments (enough for these rules: no rule matches inside strings
    but the algorithm names, which are looked for separately)."""
    return re.sub(r"//[^\n]*", "", text)


def sources(root):
    return sorted(p for p in root.rglob("*") if p.suffix in (".h", ".cpp", ".cu", ".cuh"))


def algorithm_names():
    names = {}
    for p in sorted((SRC / "peer" / "algorithms").glob("*.cpp")):
        for m in re.finditer(r'\.name\s*=\s*"([a-z_0-9]+)"', p.read_text()):
            names[m.group(1)] = p
    return names


def own_files(name, path):
    """An algorithm's own files: its registration's file and the helpers named after it
    (dgc_memory.*, demo_transform.*)."""
    stem = path.stem
    return lambda p: p.parent == path.parent and (p.stem == stem or p.stem.startswith(stem + "_"))


def check_sizes(problems):
    for p in sources(SRC):
        n = p.read_text(errors="replace").count("\n")
        rel = p.relative_to(ROOT)
        if n > MAX_LINES:
            problems.append(f"{rel}: {n} lines; no file of src/ is over {MAX_LINES}")
        if p.parent.name == "peer" and (p.name == "gossip_engine.cpp" or p.name.startswith("engine_")) and n >= MAX_ENGINE_LINES:
            problems.append(f"{rel}: {n} lines; the engine's files are under {MAX_ENGINE_LINES}")


def check_algorithm_names(problems):
    names = algorithm_names()
    if len(names) < 10:
        problems.append(f"src/peer/algorithms: found only {len(names)} registered algorithms; the rule reads `.name = \"...\"`")
    for p in sources(SRC):
        text = code_only(p.read_text(errors="replace"))
        for name, home in names.items():
            if own_files(name, home)(p):
                continue
            for m in re.finditer(r'"' + re.escape(name) + r'"', text):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{p.relative_to(ROOT)}:{line}: names the algorithm \"{name}\" outside its own file "
                                f"({home.relative_to(ROOT)}); use a flag of its registry entry")


def check_clock(problems):
    for p in sources(SRC / "peer"):
        text = code_only(p.read_text(errors="replace"))
        for m in TIME_CALLS.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{p.relative_to(ROOT)}:{line}: {m.group(1).strip('( ')} in src/peer; read time and sleep "
                            f"through a Clock (include/hearsay/clock.h)")
        for m in WAIT_CALL.finditer(text):
            if CLOCK_RECEIVER.search(m.group(1)):
                continue
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{p.relative_to(ROOT)}:{line}: {m.group(1)}.{m.group(2)}(...) waits outside a Clock; "
                            f"use clock.wait_for(lock, cv, timeout, ready)")


def check_algorithm_includes(problems):
    for p in sources(SRC / "peer" / "algorithms"):
        text = p.read_text(errors="replace")
        for m in ALGORITHM_FORBIDDEN_INCLUDES.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{p.relative_to(ROOT)}:{line}: an algorithm includes {m.group(1)}; it sees the engine "
                            f"through algorithm.h only")


def check_engine_blind_to_sites(problems):
    for p in sorted((SRC / "peer").glob("*.cpp")):
        if not (p.name == "gossip_engine.cpp" or p.name.startswith("engine_")) or p.name == "engine_factory.cpp":
            continue
        text = p.read_text(errors="replace")
        for m in re.finditer(r'#include\s+"(site_[\w]*\.h)"', text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{p.relative_to(ROOT)}:{line}: the engine includes {m.group(1)}; site replicas wrap the "
                            f"algorithm (site_algorithm.cpp), the engine does not call them")


def check_phase_carving(problems):
    for p in sources(SRC / "peer"):
        if p.name == "phases.h":
            continue
        text = code_only(p.read_text(errors="replace"))
        for m in re.finditer(r"\b1u?\s*<<\s*(1[6-9]|2[0-9]|3[01])\b", text):
            line = text.count("\n", 0, m.start()) + 1
            if "phase" not in text.split("\n")[line - 1].lower():
                continue  # a size or a count, not a phase
            problems.append(f"{p.relative_to(ROOT)}:{line}: a phase carved with 1 << {m.group(1)}; take a range of "
                            f"src/peer/phases.h")


def resolve(include, where):
    for base in (where.parent, ROOT / "include", SRC):
        q = (base / include).resolve()
        if q.is_file():
            return q
    return None


def check_include_cycles(problems):
    headers = [p.resolve() for p in sources(SRC) + sources(ROOT / "include") if p.suffix in (".h", ".cuh")]
    graph = {h: [] for h in headers}
    for h in headers:
        for inc in INCLUDE.findall(h.read_text(errors="replace")):
            q = resolve(inc, h)
            if q in graph:
                graph[h].append(q)
    state = {}
    stack = []

    def visit(h):
        state[h] = 1
        stack.append(h)
        for q in graph[h]:
            if state.get(q) == 1:
                cycle = stack[stack.index(q):] + [q]
                problems.append("include circle: " + " -> ".join(str(c.relative_to(ROOT)) for c in cycle))
            elif q not in state:
                visit(q)
        stack.pop()
        state[h] = 2

    for h in headers:
        if h not in state:
            visit(h)


def main():
    problems = []
    check_sizes(problems)
    check_algorithm_names(problems)
    check_clock(problems)
    check_algorithm_includes(problems)
    check_engine_blind_to_sites(problems)
    check_phase_carving(problems)
    check_include_cycles(problems)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} breach(es) of the house rules (tests/check_house.py's docstring)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
