# tools/gdb/ntensor_gdb.py - gdb support for programs that use ntensor.
#
# Pretty-printers
#   nt_tensor *   one line: id, shape, dtype, backend, state and, once the
#                 tensor is ready, its values as nt_print writes them (on one
#                 line); "released handle" for a released one
#   nt_tensor     (print *t) the same in full: strides, storage, where the
#                 tensor was made, references, autograd, values as nt_print
#   nt__rec *     an op record: op, call site, seq, inputs and outputs
# Commands
#   nt-tensor EXPR   everything about one tensor (as print *EXPR)
#   nt-queue         the ops waiting on each stream, with their call sites
#   nt-stats         the runtime's counters
#   nt-step          run the current line until the kernel of its first op
#   nt-finish        return from the runtime to the user's frame
#
# The state is computed as the runtime computes it: a tensor is pending
# while the op that last wrote its storage (storage.last_write = (stream,
# seq)) is past that stream's done_upto, poisoned when its storage carries an
# error, ready otherwise.  Everything is read from memory (no function is
# called in the program), so the printers work on core files too.
#
# gdb loads this file automatically for a program linked with libntensor
# when it is installed (see docs/debugging.md); otherwise:
#   (gdb) source tools/gdb/ntensor_gdb.py
import math
import os
import re
import struct

import gdb

MAGIC_LIVE = 0x4E54544E
MAGIC_DEAD = 0xDEADBEEF
MAGIC_OLD = 0x0FD0FD0F  # freed by the nt_shutdown before the running runtime
SEQ_MASK = (1 << 48) - 1
OP_CUSTOM_BASE = 1024
REC_TYPES = {0: "op", 1: "wait", 2: "host"}
# name, element size, struct format (bf16 and fp8 are converted by hand)
DTYPES = {0: ("f32", 4, "<f"), 1: ("bf16", 2, "<H"), 2: ("f16", 2, "<e"),
          3: ("i32", 4, "<i"), 4: ("u8", 1, "<B"), 5: ("f64", 8, "<d"),
          6: ("i64", 8, "<q"), 7: ("bool", 1, "<B"), 8: ("e4m3", 1, "<B"),
          9: ("e5m2", 1, "<B")}
FLOAT_DTYPES = (0, 1, 2, 5, 8, 9)


def decode_e4m3(c):
    """OCP e4m3 (core/dtype.h): bias 7, no infinities, S.1111.111 is NaN."""
    s = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 3) & 0xF, c & 7
    if c & 0x7F == 0x7F:
        return float("nan")
    if e == 0:
        return s * m * 2.0 ** -9
    return s * (1 + m / 8.0) * 2.0 ** (e - 7)


def decode_e5m2(c):
    """OCP e5m2: the top byte of an f16."""
    return struct.unpack("<e", struct.pack("<H", c << 8))[0]


PRINT_THRESHOLD = 1000   # core/print.c
PRINT_EDGE = 3
PRINT_WIDTH = 80
MAX_READ = 64 << 20      # read a view's whole span at once up to this size
QUEUE_SHOW = 200         # records listed per queue before "... more"


# ---------------------------------------------------------------- symbols

def _static(name, file_suffix):
    """The static variable `name` defined in a file ending with file_suffix."""
    try:
        for sym in gdb.lookup_static_symbols(name):
            if sym.symtab and sym.symtab.filename.endswith(file_suffix):
                return sym.value()
    except (AttributeError, gdb.error):
        pass
    try:
        return gdb.parse_and_eval("'%s'::%s" % (os.path.basename(file_suffix), name))
    except gdb.error:
        return None


def _global(name):
    try:
        sym = gdb.lookup_global_symbol(name)
        if sym is not None:
            return sym.value()
    except gdb.error:
        pass
    try:
        return gdb.parse_and_eval(name)
    except gdb.error:
        return None


def _type(name):
    return gdb.lookup_type(name)


def _cstr(v, default="?"):
    try:
        if v.type.strip_typedefs().code == gdb.TYPE_CODE_ARRAY:
            return v.string(length=-1).split("\0")[0]
        if int(v) == 0:
            return default
        return v.string()
    except (gdb.error, gdb.MemoryError, UnicodeDecodeError):
        return default


def stream_by_id(sid):
    """The live nt_stream * with this id, or None."""
    if sid == 0:
        return None
    reg = _static("S", "streams/stream.c")
    if reg is None:
        return None
    try:
        p = int(reg["reg"][sid])
    except (gdb.error, gdb.MemoryError):
        return None
    if p == 0:
        return None
    return gdb.Value(p).cast(_type("struct nt_stream").pointer())


def all_streams():
    reg = _static("S", "streams/stream.c")
    if reg is None:
        raise gdb.GdbError("ntensor: cannot find the stream registry (is the program "
                           "linked with ntensor, with debug info?)")
    out = []
    for sid in range(1, int(reg["next_id"]) + 1):
        s = stream_by_id(sid)
        if s is not None:
            out.append(s)
    return out


def op_api(op):
    """"nt_add" for an op id; a registered user op by its name."""
    op = int(op)
    if op >= OP_CUSTOM_BASE:
        reg = _static("reg", "autograd/custom.c")
        try:
            c = reg[op - OP_CUSTOM_BASE]
            if int(c):
                return _cstr(c["api"])
        except (gdb.error, gdb.MemoryError, TypeError):
            pass
        return "user op %d" % op
    ops = _global("nt__ops")
    try:
        # The table is declared unsized in core/internal.h (so its
        # _Static_assert catches a missing last row): its length is the
        # enum's NT_OP_COUNT, not the array type's range.
        count = int(gdb.parse_and_eval("NT_OP_COUNT"))
        if 0 <= op < count:
            return _cstr(ops[op]["api"])
    except (gdb.error, AttributeError, TypeError):
        pass
    return "op %d" % op


def site_str(site):
    """A call site as the runtime writes it: "file:line in func"."""
    f = int(site["file"])
    if f:
        s = "%s:%d" % (_cstr(site["file"]), int(site["line"]))
        if int(site["func"]):
            s += " in " + _cstr(site["func"])
        return s
    ra = int(site["ra"])
    if ra:
        sal = gdb.find_pc_line(ra)
        blk = None
        try:
            blk = gdb.block_for_pc(ra)
        except RuntimeError:
            pass
        fn = blk.function.name if blk is not None and blk.function else None
        if sal.symtab:
            return "%s:%d%s" % (sal.symtab.filename, sal.line, " in " + fn if fn else "")
        return "0x%x%s" % (ra, " in " + fn if fn else "")
    return "unknown site"


def short_site(site):
    """site_str with the file's directories dropped."""
    s = site_str(site)
    m = re.match(r"(.*/)?([^/]+:\d+.*)$", s)
    return m.group(2) if m else s


def backend_name(b):
    return "sim" if int(b) == 1 else "cpu"


def cfg_backend():
    cfg = _global("nt__cfg")
    try:
        return backend_name(cfg["backend"])
    except (gdb.error, TypeError):
        return "?"


def cfg_mode():
    cfg = _global("nt__cfg")
    try:
        return str(cfg["mode"]).replace("NT_MODE_", "").lower()
    except (gdb.error, TypeError):
        return "?"


# ---------------------------------------------------------------- tensors

def shape_str(dims):
    return "[" + ", ".join(str(d) for d in dims) + "]"


class Tensor(object):
    """A snapshot of an nt_tensor read from the inferior."""

    def __init__(self, ptr):
        self.addr = int(ptr)
        t = ptr.dereference()
        self.magic = int(t["magic"]) & 0xFFFFFFFF
        self.refs = int(t["refs"])
        self.irefs = int(t["irefs"])
        self.id = int(t["id"])
        if self.magic not in (MAGIC_LIVE, MAGIC_DEAD, MAGIC_OLD):
            raise ValueError("bad magic 0x%x" % self.magic)
        self.live = self.magic == MAGIC_LIVE and self.refs > 0
        self.ndim = int(t["ndim"])
        self.dtype = int(t["dtype"])
        if not (0 <= self.ndim <= 8 and self.dtype in DTYPES):
            raise ValueError("not a tensor")
        self.shape = [int(t["shape"][i]) for i in range(self.ndim)]
        self.stride = [int(t["stride"][i]) for i in range(self.ndim)]
        self.offset = int(t["offset"])
        self.site = t["site"]
        self.ag = t["ag"]
        self.st = t["st"]
        self.st_addr = int(self.st)

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def dtype_name(self):
        return DTYPES[self.dtype][0]

    def contiguous(self):
        exp = 1
        for d in range(self.ndim - 1, -1, -1):
            if self.shape[d] != 1 and self.stride[d] != exp:
                return False
            exp *= self.shape[d]
        return True

    def state(self):
        """(state, detail): released, poisoned (message), pending (why) or ready."""
        if not self.live:
            return "released", None
        st = self.st.dereference()
        poison = int(st["poison"])
        if poison:
            e = gdb.Value(poison).cast(_type("nt__errobj").pointer())
            return "poisoned", _cstr(e["msg"], "(no message)")
        lw = int(st["last_write"])
        if lw:
            sid, seq = lw >> 48, lw & SEQ_MASK
            s = stream_by_id(sid)
            if s is not None:
                done = int(s["done_upto"])
                if done < seq:
                    return "pending", "seq %d on %s, done up to %d" % (
                        seq, _cstr(s["name"]), done)
        if int(st["data"]) == 0:
            # a big storage takes its memory when first written (core/tensor.c)
            return "unwritten", "nothing has written it: no device memory taken yet"
        return "ready", None

    def header(self):
        return "t#%d %s %s %s" % (self.id, shape_str(self.shape), self.dtype_name,
                                  cfg_backend())

    # -- values

    def values(self, positions):
        """Elements at the given element offsets (relative to the view)."""
        name, es, fmt = DTYPES[self.dtype]
        base = int(self.st.dereference()["data"]) + self.offset * es
        inf = gdb.selected_inferior()
        if not positions:
            return {}
        lo, hi = min(positions), max(positions)
        out = {}
        if (hi - lo + 1) * es <= MAX_READ:
            mem = bytes(inf.read_memory(base + lo * es, (hi - lo + 1) * es))
            for p in positions:
                out[p] = self._decode(mem[(p - lo) * es:(p - lo + 1) * es], fmt)
        else:
            for p in positions:
                out[p] = self._decode(bytes(inf.read_memory(base + p * es, es)), fmt)
        return out

    def _decode(self, b, fmt):
        v = struct.unpack(fmt, b)[0]
        if self.dtype == 1:  # bf16: the high half of an f32
            v = struct.unpack("<f", struct.pack("<I", v << 16))[0]
        elif self.dtype == 8:
            v = decode_e4m3(v)
        elif self.dtype == 9:
            v = decode_e5m2(v)
        return float(v)

    def format(self):
        """The text nt_print writes (core/print.c), for a ready tensor."""
        return format_tensor(self)


def _shown_indices(t, summarize):
    """Per dim, the indices nt_print shows."""
    out = []
    for n in t.shape:
        if summarize and n > 2 * PRINT_EDGE:
            out.append(list(range(PRINT_EDGE)) + list(range(n - PRINT_EDGE, n)))
        else:
            out.append(list(range(n)))
    return out


def _fmt_value(v, is_float, mode):
    if not is_float:
        return "%.0f" % v
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "-inf" if v < 0 else "inf"
    if mode == 2:
        return "%.4e" % v
    if mode == 1:
        return "%.0f." % v
    return "%.4f" % v


def format_tensor(t):
    """core/print.c's nt__format_tensor, in Python."""
    is_float = t.dtype in FLOAT_DTYPES
    n = t.numel
    summarize = n > PRINT_THRESHOLD
    out = ["tensor("]
    if n == 0:
        out.append("[]")
        if t.ndim != 1:
            out.append(", size=(" + ", ".join(str(d) for d in t.shape) + ")")
    else:
        shown = _shown_indices(t, summarize)
        # offsets of every shown element
        idxs = [[]]
        for d in range(t.ndim):
            idxs = [i + [k] for i in idxs for k in shown[d]]
        offs = [sum(i[d] * t.stride[d] for d in range(t.ndim)) for i in idxs]
        vals = t.values(offs)
        val = {tuple(i): vals[o] for i, o in zip(idxs, offs)}
        mode = 0
        if is_float:
            finite = [v for v in val.values() if math.isfinite(v)]
            all_int = all(v == math.floor(v) for v in finite)
            nz = [abs(v) for v in finite if v != 0]
            if nz:
                mx, mn = max(nz), min(nz)
            if all_int:
                mode = 2 if nz and (mx / mn > 1000.0 or mx > 1e8) else 1
            elif nz and (mx / mn > 1000.0 or mx > 1e8 or mn < 1e-4):
                mode = 2
        width = 1
        for v in val.values():
            if is_float and (not math.isfinite(v) or v == 0):
                continue
            width = max(width, len(_fmt_value(v, is_float, mode)))

        def put(v):
            s = _fmt_value(v, is_float, mode)
            return " " * max(0, width - len(s)) + s

        if t.ndim == 0:
            out.append(put(val[()]))
        else:
            buf = []
            _emit(t, 0, [], len("tensor("), val, put, summarize, width, buf)
            out.append("".join(buf))
    if t.dtype != 0:
        out.append(", dtype=%s" % t.dtype_name)
    out.append(")")
    return "".join(out)


def _emit(t, dim, idx, indent, val, put, summarize, width, out):
    n = t.shape[dim]
    cut = summarize and n > 2 * PRINT_EDGE
    out.append("[")
    if dim == t.ndim - 1:
        per_line = max(1, (PRINT_WIDTH - indent) // (width + 2))
        k = 0
        i = 0
        while i < n:
            ellipsis = cut and i == PRINT_EDGE
            if i > 0 or ellipsis:
                if k == per_line:
                    out.append(",\n" + " " * (indent + 1))
                    k = 0
                elif i > 0:
                    out.append(", ")
            if ellipsis:
                out.append(" ...")
                k += 1
                i = n - PRINT_EDGE
                if k == per_line:
                    out.append(",\n" + " " * (indent + 1))
                    k = 0
                else:
                    out.append(", ")
            out.append(put(val[tuple(idx + [i])]))
            k += 1
            i += 1
    else:
        newlines = t.ndim - dim - 1
        i = 0
        while i < n:
            if i > 0:
                out.append("," + "\n" * newlines + " " * (indent + 1))
            if cut and i == PRINT_EDGE:
                out.append("...," + "\n" * newlines + " " * (indent + 1))
                i = n - PRINT_EDGE
            _emit(t, dim + 1, idx + [i], indent + 1, val, put, summarize, width, out)
            i += 1
    out.append("]")


def one_line(text):
    """nt_print's text on one line (for the pointer printer and bt)."""
    return re.sub(r"\s*\n\s*", " ", text)


def tensor_summary(ptr):
    """The one-line description of an nt_tensor *."""
    addr = int(ptr)
    if addr == 0:
        return "NULL"
    try:
        t = Tensor(ptr)
        state, detail = t.state()
    except (gdb.MemoryError, gdb.error):
        return "<unreadable nt_tensor pointer>"
    except ValueError as e:
        return "<not an nt_tensor: %s>" % e
    if state == "released":
        return "released handle (was t#%d)" % t.id
    head = t.header()
    if state == "poisoned":
        return "%s poisoned: %s" % (head, detail)
    if state == "pending":
        return "%s pending (made at %s; %s)" % (head, short_site(t.site), detail)
    if state == "unwritten":
        return "%s unwritten (made at %s; %s)" % (head, short_site(t.site), detail)
    try:
        return "%s ready %s" % (head, one_line(t.format()))
    except (gdb.MemoryError, gdb.error) as e:
        return "%s ready <values unreadable: %s>" % (head, e)


def tensor_details(ptr):
    """Everything about one tensor, over several lines."""
    if int(ptr) == 0:
        return "NULL"
    t = Tensor(ptr)
    state, detail = t.state()
    lines = []
    lines.append("t#%d %s %s, strides %s, offset %d%s" % (
        t.id, shape_str(t.shape), t.dtype_name, shape_str(t.stride), t.offset,
        ", contiguous" if t.contiguous() else ""))
    if state == "released":
        lines.append("  state: released (the user's last reference is gone; %d internal "
                     "references left)" % max(0, t.irefs))
        return "\n".join(lines)
    lines.append("  state: %s%s" % (state, ": " + detail if detail else ""))
    st = t.st.dereference()
    lw = int(st["last_write"])
    data = int(st["data"])
    lines.append("  device: HBM (the device arena), backend %s; storage s#%d at %s, %d "
                 "bytes, version %d, last write %s" % (
                     cfg_backend(), int(st["id"]),
                     "0x%x" % data if data else "(not taken yet)", int(st["nbytes"]),
                     int(st["version"]),
                     "seq %d on stream %d" % (lw & SEQ_MASK, lw >> 48) if lw else "none"))
    lines.append("  made at %s; references: %d user, %d internal" % (
        site_str(t.site), t.refs, t.irefs))
    if int(t.ag):
        try:
            ag = t.ag.dereference()
            s = "  autograd: requires_grad %s" % ("yes" if bool(ag["requires_grad"]) else "no")
            gf = ag["grad_fn"]
            if int(gf):
                op = int(gf["op"])
                s += ", grad_fn %s (at %s)" % (op_api(op), site_str(gf["site"]))
            lines.append(s)
        except gdb.error:
            pass
    if state == "ready":
        lines.append(t.format())
    return "\n".join(lines)


class TensorPtrPrinter(object):
    def __init__(self, val):
        self.val = val

    def to_string(self):
        if int(self.val) == 0:
            return "(nt_tensor *) 0x0"
        return "(nt_tensor *) 0x%x %s" % (int(self.val), tensor_summary(self.val))


class TensorPrinter(object):
    def __init__(self, val):
        self.val = val

    def to_string(self):
        try:
            return tensor_details(self.val.address)
        except (ValueError, gdb.MemoryError, gdb.error) as e:
            return "<nt_tensor: %s>" % e


# ---------------------------------------------------------------- records

def rec_label(r):
    api = op_api(r["op"])
    bwd = _cstr(r["bwd_of"], None) if int(r["bwd_of"]) else None
    fn = None
    try:
        fn = _cstr(r["fn"], None) if int(r["fn"]) else None
    except gdb.error:
        pass
    if bwd:
        return "%s (backward of %s)" % (api, bwd)
    if fn and fn != api:
        return "%s (in %s)" % (api, fn)
    return api


def rec_summary(r, done_upto=None, align=True):
    typ = int(r["type"])
    seq = int(r["seq"])
    if typ == 1:
        deps = ", ".join("stream %d seq %d" % (int(r["deps"][i]) >> 48,
                                              int(r["deps"][i]) & SEQ_MASK)
                         for i in range(int(r["ndeps"])))
        return "seq %-6d wait for %s" % (seq, deps or "nothing")
    if typ == 2:
        return "seq %-6d host callback %s" % (seq, str(r["host_fn"]))
    out = ""
    o = r["out"][0]
    if int(o):
        try:
            t = Tensor(o)
            out = " -> t#%d %s %s" % (t.id, shape_str(t.shape), t.dtype_name)
        except (ValueError, gdb.error, gdb.MemoryError):
            pass
    mark = ""
    if done_upto is not None and seq <= done_upto:
        mark = "  (done)"
    if not align:
        return "seq %d %s at %s%s (%s)" % (seq, rec_label(r), short_site(r["site"]), out,
                                          backend_name(r["backend"]))
    return "seq %-6d %-28s %s%s [%s]%s" % (seq, rec_label(r), short_site(r["site"]), out,
                                          backend_name(r["backend"]), mark)


class RecPtrPrinter(object):
    def __init__(self, val):
        self.val = val

    def to_string(self):
        if int(self.val) == 0:
            return "(nt__rec *) 0x0"
        try:
            return "(nt__rec *) 0x%x %s" % (int(self.val),
                                             rec_summary(self.val.dereference(), align=False))
        except (gdb.error, gdb.MemoryError) as e:
            return "(nt__rec *) 0x%x <unreadable: %s>" % (int(self.val), e)


def queue_records(s):
    """Records in the stream's wait-free queue (enqueued, not yet taken)."""
    rec_t = _type("nt__rec")
    node_off = rec_t["node"].bitpos // 8
    recs = []
    n = s["head"]["node"]["next"]
    seen = 0
    while int(n) and seen < 1000000:
        recs.append(gdb.Value(int(n) - node_off).cast(rec_t.pointer()).dereference())
        n = n.dereference()["next"]
        seen += 1
    return recs


def held_records(s):
    held = s["held"]
    if int(held) == 0:
        return []
    arr = held.dereference()
    ln = int(arr["len"])
    pdata = arr["pdata"]
    rec_p = _type("nt__rec").pointer()
    return [pdata[i].cast(rec_p).dereference() for i in range(ln)]


def queue_text():
    lines = []
    streams = all_streams()
    if not streams:
        return "ntensor: no stream (the runtime is not initialised)"
    lines.append("ntensor: mode %s, backend %s, %d stream%s" % (
        cfg_mode(), cfg_backend(), len(streams), "" if len(streams) == 1 else "s"))
    for s in streams:
        name = _cstr(s["name"])
        issued = int(s["next_seq"])
        done = int(s["done_upto"])
        held = held_records(s)
        queued = queue_records(s)
        busy = int(s["busy"])
        lines.append("stream %d (%s): %d ops issued, done up to seq %d; worker %s; %d held, "
                     "%d queued" % (int(s["id"]), name, issued, done,
                                    "running a batch" if busy else "idle", len(held),
                                    len(queued)))
        for title, recs in (("held by the worker (taken from the queue, not yet run)", held),
                            ("queued (not yet taken by the worker)", queued)):
            if not recs:
                continue
            lines.append("  " + title + ":")
            for r in recs[:QUEUE_SHOW]:
                lines.append("    " + rec_summary(r, done))
            if len(recs) > QUEUE_SHOW:
                lines.append("    ... and %d more" % (len(recs) - QUEUE_SHOW))
        err = int(s["first_error"])
        if err:
            e = gdb.Value(err).cast(_type("nt__errobj").pointer())
            lines.append("  first unreported error: " + _cstr(e["msg"]))
    return "\n".join(lines)


# ---------------------------------------------------------------- stats

def stats_text():
    ctr = _global("nt__ctr")
    if ctr is None:
        raise gdb.GdbError("ntensor: cannot find the counters (nt__ctr)")

    def c(field):
        return int(ctr[field]["v"])

    fst = _global("nt__fst")

    def f(field):
        try:
            return int(fst[field])
        except (gdb.error, TypeError):
            return 0

    kernels, groups, fused = c("kernels"), f("groups"), f("fused_ops")
    hits, misses = f("hits"), f("misses")
    syncs, wait = c("syncs"), c("sync_wait_ns")
    lines = [
        "ntensor counters (mode %s, backend %s):" % (cfg_mode(), cfg_backend()),
        "  ops         %d enqueued, %d executed, %d skipped (poisoned input)" % (
            c("ops_enqueued"), c("ops_executed"), c("ops_poisoned")),
        "  kernels     %d run: %d fused running %d ops (%.1f ops/kernel), %d single ops" % (
            kernels, groups, fused, fused / groups if groups else 0.0,
            max(0, kernels - groups)),
        "  fusion      %d breaks; kernel cache %d hits, %d misses; %d values written, %d "
        "intermediates elided" % (f("breaks"), hits, misses, f("stored"), f("elided")),
        "  syncs       %d, %.3f ms waiting" % (syncs, wait / 1e6),
        "  host        %d B to host, %d B from host; %d ops on the CPU backend" % (
            c("bytes_to_host"), c("bytes_from_host"), c("cpu_fallbacks")),
    ]
    arena = _static("A", "core/arena.c")
    if arena is not None:
        try:
            lines.append("  device      %d B in use, peak %d B of %d B" % (
                int(arena["in_use"]), int(arena["peak"]), int(arena["capacity"])))
            # released by the program, still read by queued ops (docs/architecture.md)
            lines.append("  memory      %d B waiting for queued ops, %d B of it lent to "
                         "their streams' next ops" % (
                             int(arena["waiting_c"]) + int(arena["waiting_nc"]),
                             int(arena["waiting_c"]) - int(arena["pooled"])))
        except gdb.error:
            pass
    return "\n".join(lines)


# ---------------------------------------------------------------- commands

class NtTensor(gdb.Command):
    """Show everything about a tensor: nt-tensor EXPR (an nt_tensor *)."""

    def __init__(self):
        super(NtTensor, self).__init__("nt-tensor", gdb.COMMAND_DATA, gdb.COMPLETE_EXPRESSION)

    def invoke(self, arg, from_tty):
        if not arg.strip():
            raise gdb.GdbError("usage: nt-tensor EXPR")
        v = gdb.parse_and_eval(arg)
        if v.type.strip_typedefs().code != gdb.TYPE_CODE_PTR:
            v = v.address
        v = v.cast(_type("nt_tensor").pointer())
        try:
            gdb.write(tensor_details(v) + "\n")
        except ValueError:
            raise gdb.GdbError("nt-tensor: 0x%x is not an nt_tensor" % int(v))


class NtQueue(gdb.Command):
    """List the ops waiting on each stream, with the user's call site of each.

Per stream: the records the worker took but has not run yet (held: a lazy
worker holds ops until a sync point), then the records still in the
stream's queue.  Each line: seq, op, file:line, output, backend."""

    def __init__(self):
        super(NtQueue, self).__init__("nt-queue", gdb.COMMAND_DATA)

    def invoke(self, arg, from_tty):
        gdb.write(queue_text() + "\n")


class NtStats(gdb.Command):
    """Print the runtime's counters (the numbers nt_stats_get returns)."""

    def __init__(self):
        super(NtStats, self).__init__("nt-stats", gdb.COMMAND_DATA)

    def invoke(self, arg, from_tty):
        gdb.write(stats_text() + "\n")


def _kernel_of(r):
    """Name (or address) of the function that runs record r."""
    op = int(r["op"])
    if op >= OP_CUSTOM_BASE:
        return None
    fn = None
    if int(r["backend"]) == 1:
        sim = _global("nt__sim_kernels")
        if sim is not None and int(sim[op]):
            fn = sim[op]
    if fn is None:
        fn = _global("nt__cpu_kernels")[op]
    addr = int(fn)
    if not addr:
        return None
    try:
        blk = gdb.block_for_pc(addr)
        if blk is not None and blk.function is not None:
            return blk.function.name
    except RuntimeError:
        pass
    return "*0x%x" % addr


class NtStep(gdb.Command):
    """Run the current line until the kernel of the first op it runs.

In deterministic mode (NT_DETERMINISTIC=1) each op runs on the calling
thread: nt-step stops at the first line of the kernel that computes it, with
the caller's frames below.  In the other modes the op is queued for the
stream's worker and nt-step says where; the line is then done, like next."""

    def __init__(self):
        super(NtStep, self).__init__("nt-step", gdb.COMMAND_RUNNING)

    def invoke(self, arg, from_tty):
        thread = gdb.selected_thread()
        if thread is None:
            raise gdb.GdbError("nt-step: the program is not running")
        start = gdb.selected_frame()
        bp = gdb.Breakpoint("nt__exec_rec", internal=True)
        bp.thread = thread.global_num
        bp.silent = True
        try:
            gdb.execute("next", to_string=True)
        finally:
            bp.delete()
        frame = gdb.selected_frame()
        if frame.name() != "nt__exec_rec":
            gdb.write("nt-step: no op ran on this thread (mode %s: ops run on the stream's "
                      "worker; NT_DETERMINISTIC=1 runs them here)\n" % cfg_mode())
            gdb.execute("frame", to_string=False)
            return
        r = frame.read_var("r").dereference()
        target = _kernel_of(r) if int(r["type"]) == 0 else None
        if target is None:
            gdb.write("nt-step: in nt__exec_rec for %s\n" % rec_summary(r))
            gdb.execute("frame")
            return
        kb = gdb.Breakpoint(target, internal=True, temporary=True)
        kb.thread = thread.global_num
        kb.silent = True
        try:
            gdb.execute("continue", to_string=True)
        finally:
            if kb.is_valid():
                kb.delete()
        gdb.write("nt-step: %s: kernel %s\n" % (rec_summary(r, align=False), target))
        gdb.execute("frame")


def _runtime_root():
    try:
        sym = gdb.lookup_global_symbol("nt__exec_rec")
        if sym is None or sym.symtab is None:
            return None
        return os.path.dirname(os.path.dirname(sym.symtab.fullname()))
    except gdb.error:
        return None


RUNTIME_DIRS = ("core", "dispatcher", "streams", "cpu", "sim", "neuron", "fusion", "autograd",
                "amp", "debug", "io", "dist", "init")


def is_runtime_frame(frame, root):
    fn = frame.function()
    if fn is None or fn.symtab is None:
        return True  # no debug info: libc, glib, ... inside a runtime call
    path = fn.symtab.fullname()
    return bool(root) and any(path.startswith(os.path.join(root, d) + os.sep)
                              for d in RUNTIME_DIRS)


class NtFinish(gdb.Command):
    """Return from the runtime to the user's code (finish the outermost
ntensor call in the stack), printing what that call returned."""

    def __init__(self):
        super(NtFinish, self).__init__("nt-finish", gdb.COMMAND_RUNNING)

    def invoke(self, arg, from_tty):
        root = _runtime_root()
        f = gdb.selected_frame()
        if not is_runtime_frame(f, root):
            raise gdb.GdbError("nt-finish: the selected frame is not inside ntensor")
        while f.older() is not None and is_runtime_frame(f.older(), root):
            f = f.older()
        if f.older() is None:
            raise gdb.GdbError("nt-finish: no user frame above")
        f.select()
        gdb.execute("finish")


# ---------------------------------------------------------------- stepping

# Helpers of the dispatcher that never lead to a kernel: `step` from the
# user's call goes through the op's entry point and nt__dispatch into the
# kernel without stopping in them.  `skip disable` turns them off.
SKIP_FUNCTIONS = (
    r"^(nt__call_begin|nt__check_arg|nt__tensor_(new|empty|iref|iunref|iunref_n)|"
    r"nt__scope_adopt|nt__storage_(new|ref|unref)|nt__arena_[a-z_]+|nt__rec_alloc|"
    r"nt__rec_release|nt__stream_(current|next_seq|by_id)|nt__broadcast|nt__promote|"
    r"nt__numel|nt__ensure_init|nt__initialized|complete_seq|choose_backend|add_dep|"
    r"release_tmp|bcast_out|out_like|pick_kernel|nt__now_ns|nt__trace_enabled|"
    r"nt__htrace_[a-z_]+|on_dispatch|requires|AO_[a-z_0-9]+|nt__shape_str|nt__norm_dim)$")

_skips_installed = False


def install_skips():
    global _skips_installed
    if _skips_installed:
        return
    _skips_installed = True
    try:
        gdb.execute("skip -rfunction %s" % SKIP_FUNCTIONS, to_string=True)
    except gdb.error:
        pass


# ---------------------------------------------------------------- registration

def lookup_printer(val):
    t = val.type.strip_typedefs()
    if t.code == gdb.TYPE_CODE_PTR:
        tgt = t.target().strip_typedefs()
        if tgt.code == gdb.TYPE_CODE_STRUCT:
            if tgt.tag == "nt_tensor":
                return TensorPtrPrinter(val)
            if tgt.tag == "nt__rec":
                return RecPtrPrinter(val)
        return None
    if t.code == gdb.TYPE_CODE_STRUCT and t.tag == "nt_tensor":
        return TensorPrinter(val)
    return None


lookup_printer.name = "ntensor"
lookup_printer.enabled = True


def register(objfile=None):
    target = objfile if objfile is not None else gdb
    for p in list(target.pretty_printers):
        if getattr(p, "name", None) == "ntensor":
            target.pretty_printers.remove(p)
    target.pretty_printers.append(lookup_printer)
    NtTensor()
    NtQueue()
    NtStats()
    NtStep()
    NtFinish()
    install_skips()


register(gdb.current_objfile())
