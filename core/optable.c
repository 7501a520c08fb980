/* core/optable.c - names, arities, kinds and flags, expanded from the table. */
#include "core/hooks.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>

/* Unsized: its size is the last row's id + 1, so the assert below sees a
 * missing last row (a missing middle row has no name: test_conformance). */
const nt__opinfo nt__ops[] = {
#define NT__OP_INFO(ID, name, nin, kind, flags, ints, amp, bwd, save, sim)                 \
    [NT_OP_##ID] = {#name, "nt_" #name, nin, kind, (flags) | NT__INTS_##ints, NT__AMP_##amp},
    NT_OP_TABLE(NT__OP_INFO)
#undef NT__OP_INFO
};

/* The enum, the info table and every backend table are expanded from the same
 * X-macro; this catches a table whose last row fell out of step. */
_Static_assert(sizeof nt__ops / sizeof nt__ops[0] == NT_OP_COUNT, "op table out of step");
_Static_assert(NT_OP_COUNT < NT_OP_CUSTOM_BASE, "too many built-in ops");

const nt__opinfo *nt__opinfo_get(int op)
{
    if (op >= 0 && op < NT_OP_COUNT)
        return &nt__ops[op];
    /* registered user ops live in autograd/custom.c (core/hooks.h) */
    if (op >= NT_OP_CUSTOM_BASE && nt__chooks.custom_opinfo)
        return nt__chooks.custom_opinfo(op);
    return NULL;
}

_Noreturn void nt__op_unhandled(const char *where, int op)
{
    /* a table column or a switch is missing this op: a wrong answer would
     * be worse than stopping here */
    fprintf(stderr, "ntensor: internal error: %s has no case for op %d (%s)\n", where, op,
            nt__op_name(op));
    abort();
}

const char *nt__op_name(int op)
{
    const nt__opinfo *i = nt__opinfo_get(op);
    return i ? i->name : "?";
}

const char *nt__op_api(int op)
{
    const nt__opinfo *i = nt__opinfo_get(op);
    return i ? i->api : "?";
}

NT_API const char *nt_dtype_name(nt_dtype dt)
{
    static const char *names[NT_DTYPE_COUNT] = {"f32", "bf16", "f16", "i32",  "u8",
                                                "f64", "i64",  "bool", "e4m3", "e5m2"};
    return (unsigned)dt < NT_DTYPE_COUNT ? names[dt] : "?";
}

NT_API size_t nt_dtype_size(nt_dtype dt) { return nt__dtype_size(dt); }
