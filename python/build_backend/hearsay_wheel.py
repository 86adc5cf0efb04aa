"""hearsay's wheel: a PEP 517 build backend with nothing to fetch, and `make wheel`'s tool.

pip builds a project in an isolated environment into which it installs the backend's
requirements from an index; offline, with Debian's setuptools outside that environment,
no backend could be installed. This one is carried in the repository (pyproject.toml's
backend-path) and uses only the standard library: CMake builds the native parts, and the
wheel is written here as the wheel format (PEP 427) states it.

The wheel holds the package `hearsay` (python/hearsay/*.py), its extension hearsay._engine,
the native programs hearsay-peer and hearsay-sim with the experiment tools beside them in
hearsay/bin/, and console scripts hearsay-peer, hearsay-sim, hearsay-run, hearsay-plot and hearsay-torchrun.
The native parts link Debian's libraries (protobuf, OpenBLAS, libfabric, ...) and CUDA's
where it was built with CUDA: the wheel installs where the same packages are installed.

    /usr/bin/python3 python/build_backend/hearsay_wheel.py --build-dir B --wheel-dir dist [--no-build]
"""
import base64
import hashlib
import io
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE_PROGRAMS = ("hearsay-peer", "hearsay-sim")
# The experiment tools hearsay-run and hearsay-plot, the modules they import, and the
# report's page template (hearsay_plot reads it beside itself).
TOOLS = ("hearsay_run.py", "hearsay_plot.py", "hearsay_logs.py", "hearsay_metrics.py", "hearsay_figures.py",
         "hearsay_panels.py", "hearsay_draw.py", "report_template.html")
TARGETS = ("hearsay-peer", "hearsay-sim", "hearsay_python_engine")


class WheelError(Exception):
    pass


def project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def version():
    with open(os.path.join(ROOT, "VERSION"), encoding="utf-8") as f:
        v = f.read().strip()
    if not re.fullmatch(r"\d+\.\d+\.\d+", v):
        raise WheelError(f"{ROOT}/VERSION: '{v}' is not a version MAJOR.MINOR.PATCH")
    return v


def wheel_tag():
    """cpXY-cpXY-PLATFORM of the python3 running this: the extension is built for it."""
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{platform}"


def build_native(build_dir, cmake_flags=()):
    """Configures build_dir where it has no cache yet, then builds what the wheel holds."""
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        run(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", *cmake_flags])
    run(["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2), "--target", *TARGETS])


def run(argv):
    print("hearsay-wheel: " + " ".join(argv), file=sys.stderr, flush=True)
    r = subprocess.run(argv, stdout=sys.stderr)
    if r.returncode != 0:
        raise WheelError(f"'{' '.join(argv)}' failed with exit status {r.returncode}")


def native_files(build_dir):
    """{path in the wheel: file here} of the built extension and programs; a clear error
    naming what is missing (a build without pybind11, say)."""
    files = {}
    ext_suffix = sysconfig.get_config_var("EXT_SUFFIX")
    engine = os.path.join(build_dir, "python", "hearsay", "_engine" + ext_suffix)
    if not os.path.exists(engine):
        raise WheelError(f"{engine} is missing: the build in {build_dir} has no Python extension for "
                         f"{sys.executable} (pybind11-dev and python3-dev, HEARSAY_PYTHON)")
    files["hearsay/_engine" + ext_suffix] = engine
    for program in NATIVE_PROGRAMS:
        path = os.path.join(build_dir, "bin", program)
        if not os.path.exists(path):
            raise WheelError(f"{path} is missing: build it first (make build)")
        files["hearsay/bin/" + program] = path
    return files


def source_files():
    files = {}
    package = os.path.join(ROOT, "python", "hearsay")
    for name in sorted(os.listdir(package)):
        if name.endswith(".py"):
            files["hearsay/" + name] = os.path.join(package, name)
    for name in TOOLS:
        files["hearsay/bin/" + name] = os.path.join(ROOT, "experiments", name)
    return files


def metadata(meta, v):
    lines = ["Metadata-Version: 2.1", f"Name: {meta['name']}", f"Version: {v}",
             f"Summary: {meta['description']}", f"Requires-Python: {meta['requires-python']}"]
    for extra, reqs in meta.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    readme = open(os.path.join(ROOT, meta["readme"]), encoding="utf-8").read()
    return "\n".join(lines) + "\nDescription-Content-Type: text/markdown\n\n" + readme


def entry_points(meta):
    lines = ["[console_scripts]"] + [f"{name} = {target}" for name, target in meta["scripts"].items()]
    return "\n".join(lines) + "\n"


def write_wheel(wheel_dir, build_dir):
    meta, v = project(), version()
    name = meta["name"]
    tag = wheel_tag()
    dist_info = f"{name}-{v}.dist-info"
    os.makedirs(wheel_dir, exist_ok=True)
    filename = f"{name}-{v}-{tag}.whl"
    path = os.path.join(wheel_dir, filename)
    contents = {}  # path in the wheel -> (bytes, executable)
    for arc, src in {**source_files(), **native_files(build_dir)}.items():
        with open(src, "rb") as f:
            contents[arc] = (f.read(), os.access(src, os.X_OK) and arc.startswith("hearsay/bin/"))
    # The package's own version, which hearsay/__init__.py checks against the extension's.
    contents["hearsay/_version.py"] = (f'__version__ = "{v}"\n'.encode(), False)
    contents[f"{dist_info}/METADATA"] = (metadata(meta, v).encode(), False)
    contents[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: hearsay_wheel\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(), False)
    contents[f"{dist_info}/entry_points.txt"] = (entry_points(meta).encode(), False)
    record = []
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, (data, executable) in contents.items():
            info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            # A regular file's mode: pip sets the executable bits only where S_ISREG holds.
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        z.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    os.replace(tmp, path)
    return filename


def _settings(config_settings):
    s = config_settings or {}
    build_dir = s.get("build-dir") or os.environ.get("HEARSAY_BUILD_DIR") or os.path.join(ROOT, "build")
    return os.path.abspath(build_dir), str(s.get("no-build", "")).lower() in ("1", "true", "yes")


# --- PEP 517 hooks ------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build_dir, no_build = _settings(config_settings)
    if not no_build:
        build_native(build_dir)
    return write_wheel(wheel_directory, build_dir)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="Write hearsay's wheel.")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"), help="the CMake build folder (default build/)")
    ap.add_argument("--wheel-dir", default=os.path.join(ROOT, "dist"))
    ap.add_argument("--no-build", action="store_true", help="package what build-dir holds without building")
    ap.add_argument("--cmake-flag", action="append", default=[], help="for a build folder configured here")
    args = ap.parse_args(argv)
    try:
        if not args.no_build:
            build_native(os.path.abspath(args.build_dir), args.cmake_flag)
        print(os.path.join(args.wheel_dir, write_wheel(args.wheel_dir, os.path.abspath(args.build_dir))))
    except (WheelError, OSError) as e:
        print(f"hearsay-wheel: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
