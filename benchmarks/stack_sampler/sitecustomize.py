"""A sampling profiler for start-up, loaded into every Python process of a run (driver, Ray's daemons
and workers) by putting this folder on PYTHONPATH with VERL_STACK_SAMPLES=<folder> set.

Every 10 ms, for the first VERL_STACK_SECONDS (default 60) of the process, it records each thread's
stack; every 2 s, at the end of that window and at exit it rewrites one file per process, `<pid>.txt`
(Ray kills its workers without running exit handlers, so the last rewrite is what survives):
the command line, then per thread the sampled seconds by frame (inclusive), the heaviest first. Native
calls are charged to the Python line that made them (a CUDA initialisation shows up under the function
calling torch's). The files are plain text; a frame's seconds include its callees'.
"""
import os

if os.environ.get("VERL_STACK_SAMPLES"):
    import atexit
    import collections
    import sys
    import threading
    import time

    _FOLDER = os.environ["VERL_STACK_SAMPLES"]
    _SECONDS = float(os.environ.get("VERL_STACK_SECONDS", "60"))
    _INTERVAL = 0.01
    _START = time.time()
    _inclusive: dict = collections.defaultdict(collections.Counter)
    _samples: collections.Counter = collections.Counter()   # seconds per thread
    _written = threading.Event()
    _lock = threading.Lock()

    def _sample() -> None:
        me = threading.get_ident()
        last_dump = previous = time.time()
        while time.time() - _START < _SECONDS and not _written.is_set():
            if time.time() - last_dump > 2:
                _dump(final=False)
                last_dump = time.time()
            now = time.time()
            weight, previous = now - previous, now   # seconds this sample stands for
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                thread = names.get(ident, str(ident))
                _samples[thread] += weight
                seen = set()
                while frame is not None:
                    code = frame.f_code
                    key = f"{code.co_filename}:{code.co_firstlineno} {code.co_name}"
                    if key not in seen:   # a recursive function counts once per sample
                        seen.add(key)
                        _inclusive[thread][key] += weight
                    frame = frame.f_back
            time.sleep(_INTERVAL)
        _dump()

    def _dump(final: bool = True) -> None:
        with _lock:
            if _written.is_set():
                return
            if final:
                _written.set()
            os.makedirs(_FOLDER, exist_ok=True)
            _write(os.path.join(_FOLDER, f"{os.getpid()}.txt"))

    def _write(path: str) -> None:
        with open(path + ".tmp", "w") as out:
            out.write(" ".join(sys.argv)[:300] + "\n")
            out.write(f"started {_START:.3f} ended {time.time():.3f}\n")
            for thread, count in list(_samples.most_common()):
                out.write(f"== thread {thread}: {count:.2f} s sampled\n")
                for key, n in list(_inclusive[thread].most_common(80)):
                    out.write(f"{n:8.2f}  {key}\n")
        os.replace(path + ".tmp", path)

    atexit.register(_dump)
    threading.Thread(target=_sample, name="stack-sampler", daemon=True).start()
