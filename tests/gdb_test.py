#!/usr/bin/env python3
"""tests/gdb_test.py - drives gdb in batch mode over examples/debug_demo.

Checks what docs/debugging.md promises, from gdb's real output:
  - gdb auto-loads tools/gdb/ntensor_gdb.py (the build tree's copy
    libntensor.so.<version>-gdb.py) for a program linked with libntensor;
  - deterministic mode: a breakpoint in the kernel has the user's frame in
    the backtrace; nt-step and plain `step` reach the kernel; finishing back
    to the user prints the result, ready, with its values;
  - the pretty-printers: values exactly as nt_print writes them (f32, bf16,
    a summarised tensor), pending / poisoned / released states;
  - nt-queue in lazy mode lists the held and queued ops with file:line;
  - nt-stats prints the counters;
  - NT_TRACE writes JSON (parsed with the json module) holding the expected
    host and simulator events; NT_STATS prints its summary.
Prints TAP.  Under AddressSanitizer (--sanitize) gdb runs with
detect_leaks=0: LeakSanitizer cannot stop the world under ptrace."""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


class Tap(object):
    def __init__(self):
        self.n = 0
        self.failed = 0

    def check(self, cond, name, diag=""):
        self.n += 1
        if cond:
            print("ok %d - %s" % (self.n, name))
        else:
            self.failed += 1
            print("not ok %d - %s" % (self.n, name))
            for line in str(diag).splitlines()[-60:]:
                print("# " + line)
        sys.stdout.flush()
        return cond

    def skip(self, name, why):
        self.n += 1
        print("ok %d - %s # SKIP %s" % (self.n, name, why))

    def done(self):
        print("1..%d" % self.n)
        return 1 if self.failed else 0


def markers(source):
    """{name: line} for the "/* @name */" comments of the demo."""
    out = {}
    with open(source) as f:
        for i, line in enumerate(f, 1):
            for m in re.finditer(r"@(\w+)", line):
                out[m.group(1)] = i
    return out


class Gdb(object):
    def __init__(self, args):
        self.gdb = args.gdb
        self.demo = args.demo
        self.build_root = args.build_root
        self.asan = args.sanitize not in ("", "none")
        self.tmp = tempfile.mkdtemp(prefix="nt_gdb_")

    def env(self, extra, under_gdb=True):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("NT_"):
                del env[k]
        env["NT_LOG"] = "error"
        if self.asan and under_gdb:
            opts = env.get("ASAN_OPTIONS", "")
            env["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "detect_leaks=0"
        env.update(extra)
        return env

    def run(self, script, extra_env, name):
        """Runs gdb on the demo with `script`; returns (gdb output, the
        program's stdout)."""
        cmd_file = os.path.join(self.tmp, name + ".gdb")
        out_file = os.path.join(self.tmp, name + ".out")
        with open(cmd_file, "w") as f:
            f.write(script.replace("@OUT@", out_file))
        argv = [self.gdb, "-nx", "-q", "-batch",
                "-iex", "set pagination off",
                "-iex", "set confirm off",
                "-iex", "set debuginfod enabled off",
                "-iex", "add-auto-load-safe-path " + self.build_root,
                "-x", cmd_file, self.demo]
        try:
            p = subprocess.run(argv, env=self.env(extra_env), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=300,
                               universal_newlines=True)
            text = p.stdout
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or "") + "\n<gdb timed out>"
        prog = ""
        if os.path.exists(out_file):
            with open(out_file, errors="replace") as f:
                prog = f.read()
        return text, prog


def between(text, start, end):
    """The text between two echo markers."""
    start, end = start + "\n", end + "\n"
    i = text.find(start)
    j = text.find(end, i + len(start)) if i >= 0 else -1
    return text[i + len(start):j].strip("\n") if i >= 0 and j >= 0 else ""


def value_of(block):
    """The value of the first `$N = ...` in block."""
    m = re.search(r"^\$\d+ = (.*)", block, re.S | re.M)
    return m.group(1).rstrip("\n") if m else ""


def prints_of(prog):
    """The tensor(...) texts nt_print wrote to the program's stdout."""
    out, cur = [], None
    for line in prog.splitlines():
        if line.startswith("tensor("):
            cur = [line]
        elif cur is not None:
            cur.append(line)
        if cur is not None and cur[-1].endswith(")"):
            out.append("\n".join(cur))
            cur = None
    return out


def one_line(text):
    return re.sub(r"\s*\n\s*", " ", text)


def elf_sections(path):
    """Section names of an ELF64 little-endian file (empty if unreadable)."""
    import struct
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return set()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return set()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if not shoff or shstrndx >= shnum:
        return set()

    def hdr(i):
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)

    stroff = hdr(shstrndx)[4]
    names = set()
    for i in range(shnum):
        off = stroff + hdr(i)[0]
        names.add(data[off:data.index(b"\0", off)].decode("ascii", "replace"))
    return names


def missing_debug_info(demo, build_root):
    """Why the gdb checks cannot run (a binary without DWARF), or None."""
    libs = sorted(glob.glob(os.path.join(build_root, "libntensor.so*")))
    for path in [demo] + libs[:1]:
        if ".debug_info" not in elf_sections(path):
            return "%s has no debug info (a --buildtype=release build?); the gdb checks " \
                   "need -g" % os.path.basename(path)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gdb", default="gdb")
    ap.add_argument("--demo", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--build-root", required=True)
    ap.add_argument("--sanitize", default="none")
    args = ap.parse_args()
    tap = Tap()
    gdb_path = shutil.which(args.gdb)
    if not gdb_path:
        print("1..0 # SKIP gdb is not installed (scripts/deps.sh installs it)")
        return 0
    args.gdb = gdb_path
    if "thread" in args.sanitize:
        print("1..0 # SKIP under ThreadSanitizer every function calls into the TSan runtime, "
              "so stepping and frames are not what a user debugs; the normal build runs these")
        return 0
    why = missing_debug_info(args.demo, args.build_root)
    if why:
        print("1..0 # SKIP " + why)
        return 0
    M = markers(args.source)
    g = Gdb(args)
    src = os.path.basename(args.source)

    # ---- deterministic mode: a breakpoint in the kernel, stepping, finish
    script = """
break {src}:{add}
run > @OUT@
echo @@AUTOLOAD\\n
info auto-load python-scripts
echo @@END\\n
break nt__cpu_binary
continue
echo @@BT\\n
bt
echo @@END\\n
echo @@FINISH\\n
nt-finish
echo @@END\\n
next
echo @@Y\\n
print y
echo @@END\\n
kill
""".format(src=src, add=M["add"])
    out, prog = g.run(script, {"NT_DETERMINISTIC": "1", "NT_BACKEND": "cpu"}, "det_cpu")
    al = between(out, "@@AUTOLOAD", "@@END")
    tap.check(re.search(r"^Yes\s+\S*libntensor\.so\.[0-9.]+-gdb\.py", al, re.M),
              "gdb auto-loads libntensor.so.*-gdb.py from next to the library", out)
    bt = between(out, "@@BT", "@@END")
    tap.check(re.search(r"^#0\s+nt__cpu_binary \(r=(?:r@entry=)?\(nt__rec \*\) 0x[0-9a-f]+ seq 1 nt_add at "
                        r"%s:%d in main" % (re.escape(src), M["add"]), bt, re.M) and
              re.search(r"in main \(\) at \S*%s:%d" % (re.escape(src), M["add"]), bt),
              "breakpoint in the CPU kernel: the user's frame (main at the nt_add line) is "
              "in the backtrace", out)
    fin = between(out, "@@FINISH", "@@END")
    want_y = "tensor([[1.5000, 1.0000, 5.0000], [4.2500, 4.5000, 7.0000]])"
    tap.check(re.search(r"Value returned is \$\d+ = \(nt_tensor \*\) 0x[0-9a-f]+ t#\d+ \[2, 3\] "
                        r"f32 cpu ready " + re.escape(want_y), fin),
              "nt-finish from the kernel returns to main with the result ready and its "
              "values", out)
    tap.check(want_y in value_of(between(out, "@@Y", "@@END")),
              "print y after the call: the values", out)

    # nt-step and plain step, on the default backend (the simulator)
    script = """
break {src}:{add}
run > @OUT@
echo @@NTSTEP\\n
nt-step
echo @@END\\n
echo @@BT\\n
bt
echo @@END\\n
kill
run > @OUT@
python
import gdb
kernels = ("nt__cpu_binary", "nt__sk_ew")
n = 0
while n < 400 and gdb.selected_frame().name() not in kernels:
    gdb.execute("step", to_string=True)
    n += 1
print("@@STEPS %d %s" % (n, gdb.selected_frame().name()))
end
echo @@BT2\\n
bt
echo @@END\\n
kill
""".format(src=src, add=M["add"])
    out, prog = g.run(script, {"NT_DETERMINISTIC": "1"}, "det_sim")
    ns = between(out, "@@NTSTEP", "@@END")
    tap.check(re.search(r"nt-step: seq 1 nt_add at %s:%d in main -> t#\d+ \[2, 3\] f32 \(\w+\): "
                        r"kernel (nt__sk_ew|nt__cpu_binary)" % (re.escape(src), M["add"]), ns),
              "nt-step from the nt_add line stops in its kernel", out)
    bt = between(out, "@@BT", "@@END")
    tap.check(re.search(r"^#0\s+(nt__sk_ew|nt__cpu_binary) ", bt, re.M) and
              re.search(r"in main \(\) at \S*%s:%d" % (re.escape(src), M["add"]), bt),
              "after nt-step: the kernel on top, main at the nt_add line below", out)
    m = re.search(r"@@STEPS (\d+) (\S+)", out)
    bt2 = between(out, "@@BT2", "@@END")
    tap.check(m and m.group(2) in ("nt__sk_ew", "nt__cpu_binary") and
              re.search(r"in main \(\) at \S*%s:%d" % (re.escape(src), M["add"]), bt2),
              "plain `step` from the nt_add line reaches the kernel (%s steps)" %
              (m.group(1) if m else "?"), out)

    # ---- the pretty-printers: values as nt_print writes them
    script = """
break {src}:{done}
run > @OUT@
echo @@X\\n
print x
echo @@END\\n
echo @@H\\n
print h
echo @@END\\n
echo @@BIG\\n
print *big
echo @@END\\n
echo @@BIGP\\n
print big
echo @@END\\n
echo @@LG\\n
print lg
echo @@END\\n
echo @@EMB\\n
print e
echo @@END\\n
echo @@TMP\\n
print tmp
echo @@END\\n
echo @@NTT\\n
nt-tensor y
echo @@END\\n
echo @@STATS\\n
nt-stats
echo @@END\\n
kill
""".format(src=src, done=M["done"])
    out, prog = g.run(script, {}, "printers")
    printed = prints_of(prog)
    tap.check(len(printed) == 4, "the demo printed its tensors (%d)" % len(printed), prog)
    if len(printed) >= 4:
        y_txt, r_txt, h_txt, big_txt = printed[0], printed[1], printed[2], printed[3]
        x_val = value_of(between(out, "@@X", "@@END"))
        tap.check(re.match(r"\(nt_tensor \*\) 0x[0-9a-f]+ t#\d+ \[2, 3\] f32 (sim|cpu) ready "
                           r"tensor\(\[\[1\., 2\., 3\.\], \[4\., 5\., 6\.\]\]\)$", x_val),
                  "print x: id, shape, dtype, backend, ready, values", out)
        h_val = value_of(between(out, "@@H", "@@END"))
        tap.check(h_val.endswith(" ready " + one_line(h_txt)) and "bf16" in h_val,
                  "print h (bf16): the values nt_print wrote", "gdb:  %s\nprint: %s" %
                  (h_val, h_txt))
        big_val = value_of(between(out, "@@BIG", "@@END"))
        tap.check(big_val.endswith("\n" + big_txt) and "t#" in big_val and
                  "[40, 50] f32, strides [50, 1]" in big_val,
                  "print *big: details and the summarised values, exactly as nt_print",
                  "gdb:\n%s\nprint:\n%s" % (big_val, big_txt))
        bigp = value_of(between(out, "@@BIGP", "@@END"))
        tap.check(bigp.endswith(" ready " + one_line(big_txt)),
                  "print big: the same values on one line", bigp)
    else:
        for name in ("print x", "print h (bf16)", "print *big", "print big"):
            tap.check(False, name, "no nt_print output")
    lg = value_of(between(out, "@@LG", "@@END"))
    tap.check(re.search(r"ready tensor\(\[\[\s*nan,\s*-inf, 0\.0000\], \[0\.6931, 1\.0986, "
                        r"1\.3863\]\]\)", lg),
              "print lg: NaN and -inf as nt_print writes them", lg)
    e = value_of(between(out, "@@EMB", "@@END"))
    tap.check(re.search(r"poisoned: nt_embedding \(at \S*%s:%d in main\): idx\[1\] = 7 is out "
                        r"of range" % (re.escape(src), M["embed"]), e),
              "print e: poisoned, with the failed op and its line", e)
    tmp = value_of(between(out, "@@TMP", "@@END"))
    tap.check(re.search(r"0x[0-9a-f]+ released handle \(was t#\d+\)$", tmp),
              "print tmp: a released handle", tmp)
    ntt = between(out, "@@NTT", "@@END")
    tap.check(re.search(r"state: ready", ntt) and
                        re.search(r"made at \S*%s:%d in main" % (re.escape(src), M["add"]), ntt),
              "nt-tensor y: state and where it was made", ntt)
    st = between(out, "@@STATS", "@@END")
    tap.check(re.search(r"ops\s+\d+ enqueued, \d+ executed", st) and "syncs" in st,
              "nt-stats prints the counters", st)

    # ---- nt-queue in lazy mode: held and queued ops with their lines
    script = """
break {src}:{print_r}
run > @OUT@
echo @@Q\\n
nt-queue
echo @@END\\n
echo @@PQ\\n
print q
echo @@END\\n
kill
""".format(src=src, print_r=M["print_r"])
    out, prog = g.run(script, {"NT_MODE": "lazy", "NT_LAZY_WINDOW": "100000"}, "queue")
    q = between(out, "@@Q", "@@END")
    held = q.split("held by the worker")[1].split("queued (not yet")[0] \
        if "held by the worker" in q else ""
    queued = q.split("queued (not yet taken by the worker):")[1] \
        if "queued (not yet taken by the worker):" in q else ""
    relu, sum_line, mul = M["relu"], M["relu"] + 2, M["mul"]
    want_held = [("nt_mul_scalar", relu), ("nt_relu", relu), ("nt_neg", relu + 1),
                 ("nt_exp", relu + 1), ("nt_sum", sum_line)]
    ok = all(re.search(r"seq\s+\d+\s+%s\s+\S*%s:%d in main -> t#" % (op, re.escape(src), ln),
                       held) for op, ln in want_held)
    tap.check(ok and "mode lazy" in q, "nt-queue (lazy): the five held ops, each with its "
              "file:line", q)
    # The last op may still sit in the queue or already be held by the worker
    # (a lazy worker moves queued ops to its held list whenever it wakes): it
    # must be listed in one of the two, with its line.
    tap.check(re.search(r"seq\s+\d+\s+nt_mul\s+\S*%s:%d in main -> t#\d+ \[2\] f32" %
                        (re.escape(src), mul), held + queued),
              "nt-queue (lazy): the last op, queued or held, with its file:line", q)
    pq = value_of(between(out, "@@PQ", "@@END"))
    tap.check(re.search(r"\[2\] f32 \w+ pending \(made at %s:%d in main; seq \d+ on "
                        r"nt-stream-default, done up to \d+\)" % (re.escape(src), sum_line), pq),
              "print q (lazy): pending, with where it was made", pq)

    # ---- NT_TRACE and NT_STATS (no gdb): the trace parses, events are there.
    # In lazy mode: an adaptive batch is what queued while the worker was
    # busy, so whether the demo's add, mul_scalar and relu run as one fused
    # kernel (and a fusion break is traced) would depend on timing.
    trace = os.path.join(g.tmp, "trace.json")
    env = g.env({"NT_TRACE": trace, "NT_STATS": "1", "NT_CHECK_NAN": "1", "NT_MODE": "lazy"},
                under_gdb=False)
    p = subprocess.run([args.demo], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=300)
    tap.check(p.returncode == 0 and "error: nt_log (at " in p.stdout and
              ":%d in main): produced NaN at element 0" % M["log"] in p.stdout,
              "NT_CHECK_NAN names nt_log and its line in the demo", p.stdout + p.stderr)
    tap.check(re.search(r"^ntensor stats:\n  ops\s+\d+ enqueued", p.stderr, re.M) and
              "  syncs " in p.stderr and "  simulator " in p.stderr,
              "NT_STATS prints the summary at nt_shutdown", p.stderr)
    try:
        with open(trace) as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        parsed = True
    except (OSError, ValueError, KeyError) as ex:
        events, parsed = [], False
        tap.check(False, "NT_TRACE file is valid JSON", str(ex))
    if parsed:
        tap.check(isinstance(events, list) and len(events) > 50,
                  "NT_TRACE file is valid JSON (%d events)" % len(events))
        procs = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                   if e.get("ph") == "M" and e.get("name") == "thread_name"}
        tap.check("host" in procs.values() and "NeuronCore (simulated)" in procs.values(),
                  "trace: a host and a simulated NeuronCore process", procs)
        host = [pid for pid, n in procs.items() if n == "host"]
        hpid = host[0] if host else -1
        enq = [e for e in events if e.get("pid") == hpid and e.get("ph") == "i" and
               e.get("name") == "nt_add"]
        tap.check(enq and enq[0]["args"]["site"].endswith("%s:%d in main" % (src, M["add"])),
                  "trace: the enqueue of nt_add with its file:line", enq[:1])
        syncs = [e for e in events if e.get("ph") == "X" and
                 e.get("name", "").startswith("sync: nt_print")]
        tap.check(syncs and all(e["dur"] >= 0 for e in syncs) and
                  any(e["args"]["site"].endswith(":%d in main" % M["print_y"]) for e in syncs),
                  "trace: sync waits with their call site and duration", syncs[:2])
        fused = [e for e in events if e.get("ph") == "X" and
                 e.get("name", "").startswith("fused ")]
        tap.check(fused and "ops" in fused[0]["args"] and "written" in fused[0]["args"] and
                  "elided" in fused[0]["args"] and
                  any(":%d in main" % M["relu"] in o for o in fused[0]["args"]["ops"]),
                  "trace: a fused kernel with its ops (file:line) and written/elided counts",
                  fused[:1])
        breaks = [e for e in events if e.get("name") == "fusion break"]
        tap.check(breaks and breaks[0]["args"].get("reason"),
                  "trace: fusion breaks with their reason", breaks[:1])
        spans = [e for e in events if e.get("pid") == hpid and e.get("ph") == "X" and
                 e.get("name") == "nt_sum" and
                 threads.get((hpid, e.get("tid")), "").startswith("worker of ")]
        tap.check(spans and "site" in spans[0]["args"],
                  "trace: kernel spans on the worker's track", spans[:1])
        nan = [e for e in events if e.get("ph") == "X" and e.get("name") == "nt_log" and
               "NaN" in e.get("args", {}).get("error", "")]
        tap.check(nan, "trace: the NaN check's error on the nt_log span")
        simpid = [pid for pid, n in procs.items() if n == "NeuronCore (simulated)"]
        sim = [e for e in events if simpid and e.get("pid") == simpid[0] and
               e.get("ph") == "X"]
        tap.check(len(sim) > 10, "trace: the simulator's engine events (%d)" % len(sim))
    shutil.rmtree(g.tmp, ignore_errors=True)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
