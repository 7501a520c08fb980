/* examples/char_gpt.c - trains a character-level GPT on the text of
 * Debian's fortunes package and samples from it.
 *
 *   4 layers, 4 heads, width 128, context 128, batch 16 (about 0.82M
 *   parameters): token + position embedding, pre-LN blocks of multi-head
 *   causal attention and a GELU MLP, the head tied to the token embedding
 *   (--untied for its own weight).  AdamW (betas 0.9, 0.95) in two
 *   parameter groups (weight decay 0.1 on matrices and embeddings, none on
 *   norms and biases), a scheduler object (linear warm-up then cosine decay
 *   to a tenth of the peak), gradient clipping at norm 1; --save and
 *   --resume write and read checkpoints that name each tensor as GPT-2's
 *   state_dict does (a file from before names loads by position).
 *
 * The model, the data and the batch order are in examples/gpt_model.h;
 * bench/peer/char_gpt.py trains the same in PyTorch, and bench/gpt_step runs
 * both.  Every --eval-every steps a line
 *   eval step=N train=X val=Y ms_per_step=Z
 * gives the mean training loss since the last one and the loss on fixed
 * validation batches (the peer prints the same; bench/peer/plot_loss.py
 * plots both); between them, lines with tokens per second and what the
 * simulated NeuronCore did per step (time, MFU).  It ends by sampling
 * characters from a prompt with a fixed seed.
 *
 * --dp N --tp N --zero S trains the tensor-parallel form of the model on a
 * data x tensor device mesh with ZeRO stage S (examples/gpt_mesh.h) and
 * prints the parameters' CRC-32, the same for every split and stage
 * (docs/parallel.md, "char GPT under a mesh"); --save and --resume write and
 * read a sharded mesh checkpoint, --reshard loads one saved under another
 * layout (docs/parallel.md, "Mesh checkpoints").  --ep N (or --experts E)
 * makes every block's MLP a mixture of experts split over N cores of an
 * "expert" mesh dimension (with --tp, over the tp x N block), with the same
 * bits for every N and --tp (docs/parallel.md, "MoE variant of the char
 * GPT").  --sp holds the residual stream, layer norms and dropout as each
 * tensor rank's slice of the sequence, and --dropout works under the mesh
 * too (docs/parallel.md, "Sequence parallelism and dropout").
 *
 * The backend is NT_BACKEND (sim, the default, or cpu; --backend sets it),
 * the execution mode NT_MODE (docs/env.md).  Run with --help for the
 * options. */
#include <errno.h>
#include <math.h>
#include <ntensor.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_mesh.h"


typedef struct {
    gpt_config c;
    gpt_train_opts t;
    int eval_every, eval_batches, log_every, sample;
    bool capture; /* record the first step, replay it (docs/graphs.md) */
    int64_t limit_steps; /* stop after this many steps (0: none); the schedule still spans --steps */
    const char *save, *resume, *prompt, *data, *backend, *amp;
    /* a device mesh (examples/gpt_mesh.h): any of --dp/--tp/--zero/--ep given */
    bool mesh, sp;
    bool keep_gathered; /* --zero 3 without the per-block release (gptm_set_release off) */
    bool reshard; /* --resume a mesh checkpoint of another layout */
    int dp, tp, ep, zero, blocks, shards;
    int experts, topk; /* the MoE MLP: on with --experts or --ep > 1 */
} options;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "char_gpt: %s failed: %s\n", what, nt_last_error_message());
        exit(1);
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: char_gpt [options]\n"
            "  --steps N          training steps (300)\n"
            "  --layers N         transformer blocks (4)\n"
            "  --heads N          attention heads (4)\n"
            "  --width N          model width, a multiple of --heads (128)\n"
            "  --context N        characters per sequence (128)\n"
            "  --batch N          sequences per step (16)\n"
            "  --lr X             peak learning rate (2e-3)\n"
            "  --warmup N         warm-up steps (30)\n"
            "  --limit-steps N    stop after step N (the schedule still spans --steps: for\n"
            "                     trying --save and --resume)\n"
            "  --eval-every N     an eval line every N steps (50)\n"
            "  --eval-batches N   validation batches per evaluation (8)\n"
            "  --log-every N      a progress line every N steps (10; 0: none)\n"
            "  --untied           the head has its own weight (tied to the embedding)\n"
            "  --dropout P        dropout probability in [0, 1) (0)\n"
            "  --amp bf16|fp8     autocast the forward pass to bf16, or fp8 matmuls with\n"
            "                     delayed scaling (none; docs/amp.md)\n"
            "  --checkpoint-activations  recompute each block's activations in backward\n"
            "  --capture          record the first training step as a program and replay\n"
            "                     it for the others (nt_graph_*): the same bits, no\n"
            "                     per-op dispatch\n"
            "  --no-sdpa                attention as matmul/masked_fill/softmax/matmul, not the\n"
            "                           fused nt_scaled_dot_product_attention\n"
            "  --sinpos           sinusoidal position encoding (nt_sin/nt_cos of the\n"
            "                     position) instead of the learned one (needs an even --width)\n"
            "  --rope             rotary position embedding of q and k in every block\n"
            "                     (nt_rope, GPT-NeoX layout, base 10000) instead of the\n"
            "                     learned positions (needs an even --width / --heads)\n"
            "  --save PATH        save parameters and optimizer state at every eval\n"
            "  --resume PATH      load PATH first and continue from its step\n"
            "  --seed N           seed of the initialisation and the batches (1)\n"
            "  --sample N         characters to sample at the end (300; 0: none)\n"
            "  --prompt STR       the sample's prompt (\"The \")\n"
            "  --backend NAME     sim (simulated NeuronCore) or cpu; default NT_BACKEND\n"
            "                     or sim (docs/env.md)\n"
            "  --data DIR         the fortune files (" GPT_DATA_DIR ")\n"
            "A device mesh (examples/gpt_mesh.h, docs/parallel.md): any of these trains the\n"
            "tensor-parallel model on dp x tp simulated cores (NT_SIM_CORES, set to dp x tp\n"
            "when unset; under mpirun, the cores of every process together), and prints the\n"
            "parameters' CRC-32, the same for every split and stage:\n"
            "  --dp N             data-parallel size (1)\n"
            "  --tp N             tensor-parallel size (1): heads, --blocks and the padded\n"
            "                     vocabulary split over N cores; must divide --heads\n"
            "  --zero S           ZeRO stage 0..3 over the data dimension (0)\n"
            "  --ep N             expert-parallel size (1): N > 1 (or --experts) turns on the\n"
            "                     MoE variant: every block's MLP is a mixture of experts,\n"
            "                     split over the tp x N cores of a tensor x expert block\n"
            "                     (each member keeps the shard's tokens; the other layers\n"
            "                     are tensor-parallel over --tp); tp x N must divide\n"
            "                     --experts and 8; the cores are dp x tp x ep. --amp bf16:\n"
            "                     the experts in bf16, the router in f32.\n"
            "                     Prints the tokens per expert at log lines; the same bits\n"
            "                     for every N (and --dp, --tp, --zero)\n"
            "  --experts E        experts per MoE MLP (8 when --ep > 1), hidden 4 x width each\n"
            "  --topk K           experts per token, 1..E (2); router: top-K of a softmax\n"
            "  --blocks N         the fixed K/N/V blocks of the tensor-parallel sums (4): a\n"
            "                     multiple of --tp with a power-of-two quotient, dividing --width\n"
            "  --shards N         fixed shards of each batch (8): a multiple of --dp with a\n"
            "                     power-of-two quotient, dividing --batch\n"
            "  --keep-gathered    at --zero 3, keep every block's weights gathered for the\n"
            "                     step instead of releasing each after its forward and\n"
            "                     gathering it again for its backward (the same bits)\n"
            "  --sp               sequence parallelism: the residual stream, layer norms and\n"
            "                     dropout hold --context / --tp positions per tensor rank\n"
            "                     (--context a multiple of --blocks); one CRC for every split\n"
            "  --reshard          --resume a mesh checkpoint saved under another --dp, --tp,\n"
            "                     --ep or --zero: its parameters and AdamW state are put\n"
            "                     together and cut for this layout (without it: an error)\n"
            "  Under a mesh: --amp bf16, --dropout (masks keyed on the global token position:\n"
            "  the same bits for every split), --save and --resume (a sharded checkpoint: PATH\n"
            "  and PATH.tp<m>of<n>.zero<r>of<R>) work; --capture records the second step over\n"
            "  every core and replays it (not with --dropout, --ep/--experts, MPI, or --zero 3\n"
            "  with an evaluation before the last step);\n"
            "  refused with an error: --amp fp8, --checkpoint-activations, --untied, --sinpos,\n"
            "  --rope, --no-sdpa; no sample at the end.\n");
}

static long parse_long(const char *opt, const char *v, long lo)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || x < lo) {
        fprintf(stderr, "char_gpt: %s needs an integer >= %ld (got '%s')\n", opt, lo,
                v ? v : "");
        exit(1);
    }
    return x;
}

static double parse_double(const char *opt, const char *v, double lo, double hi)
{
    char *end;
    double x = v ? strtod(v, &end) : NAN;
    if (!v || *end || !(x >= lo && x < hi)) {
        fprintf(stderr, "char_gpt: %s needs a number in [%g, %g) (got '%s')\n", opt, lo, hi,
                v ? v : "");
        exit(1);
    }
    return x;
}

/* The options a mesh run does not take (examples/gpt_mesh.h says why). */
static void mesh_refuse(const options *o)
{
    const char *bad = !strcmp(o->amp, "fp8")   ? "--amp fp8"
                      : o->c.checkpoint        ? "--checkpoint-activations"
                      : o->c.untied            ? "--untied"
                      : o->c.sinpos            ? "--sinpos"
                      : o->c.rope              ? "--rope"
                      : o->c.composite_attn    ? "--no-sdpa"
                                               : NULL;
    if (bad) {
        fprintf(stderr, "char_gpt: %s is not supported with --dp/--tp/--zero/--ep (a device "
                        "mesh); see --help\n", bad);
        exit(1);
    }
    if (o->zero > 3) {
        fprintf(stderr, "char_gpt: --zero must be 0, 1, 2 or 3 (got %d)\n", o->zero);
        exit(1);
    }
}

static void parse_args(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool used = true;
        if (!strcmp(a, "--steps"))
            o->t.steps = parse_long(a, v, 1);
        else if (!strcmp(a, "--layers"))
            o->c.n_layer = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--heads"))
            o->c.n_head = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--width"))
            o->c.width = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--context"))
            o->c.context = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--batch"))
            o->t.batch = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--limit-steps"))
            o->limit_steps = parse_long(a, v, 1);
        else if (!strcmp(a, "--warmup"))
            o->t.warmup = parse_long(a, v, 0);
        else if (!strcmp(a, "--eval-every"))
            o->eval_every = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--eval-batches"))
            o->eval_batches = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--log-every"))
            o->log_every = (int)parse_long(a, v, 0);
        else if (!strcmp(a, "--seed"))
            o->t.seed = (uint64_t)parse_long(a, v, 0);
        else if (!strcmp(a, "--sample"))
            o->sample = (int)parse_long(a, v, 0);
        else if (!strcmp(a, "--lr"))
            o->t.lr = parse_double(a, v, 1e-12, 10);
        else if (!strcmp(a, "--dropout"))
            o->c.dropout = parse_double(a, v, 0, 1);
        else if (!strcmp(a, "--dp"))
            o->dp = (int)parse_long(a, v, 1), o->mesh = true;
        else if (!strcmp(a, "--tp"))
            o->tp = (int)parse_long(a, v, 1), o->mesh = true;
        else if (!strcmp(a, "--ep"))
            o->ep = (int)parse_long(a, v, 1), o->mesh = true;
        else if (!strcmp(a, "--experts"))
            o->experts = (int)parse_long(a, v, 1), o->mesh = true;
        else if (!strcmp(a, "--topk"))
            o->topk = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--zero"))
            o->zero = (int)parse_long(a, v, 0), o->mesh = true;
        else if (!strcmp(a, "--blocks"))
            o->blocks = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--shards"))
            o->shards = (int)parse_long(a, v, 1);
        else if (!strcmp(a, "--amp") && v)
            o->amp = v;
        else if (!strcmp(a, "--save") && v)
            o->save = v;
        else if (!strcmp(a, "--resume") && v)
            o->resume = v;
        else if (!strcmp(a, "--prompt") && v)
            o->prompt = v;
        else if (!strcmp(a, "--data") && v)
            o->data = v;
        else if (!strcmp(a, "--backend") && v)
            o->backend = v;
        else {
            used = false;
            if (!strcmp(a, "--untied"))
                o->c.untied = true;
            else if (!strcmp(a, "--checkpoint-activations"))
                o->c.checkpoint = true;
            else if (!strcmp(a, "--no-sdpa"))
                o->c.composite_attn = true;
            else if (!strcmp(a, "--capture"))
                o->capture = true;
            else if (!strcmp(a, "--sp"))
                o->sp = true, o->mesh = true;
            else if (!strcmp(a, "--keep-gathered"))
                o->keep_gathered = true, o->mesh = true;
            else if (!strcmp(a, "--sinpos"))
                o->c.sinpos = true;
            else if (!strcmp(a, "--rope"))
                o->c.rope = true;
            else if (!strcmp(a, "--reshard"))
                o->reshard = true;
            else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
                usage(stdout);
                exit(0);
            } else {
                fprintf(stderr, "char_gpt: unknown or incomplete option '%s'\n", a);
                usage(stderr);
                exit(1);
            }
        }
        if (used)
            i++;
    }
    if (o->c.width % o->c.n_head) {
        fprintf(stderr, "char_gpt: --width (%d) must be a multiple of --heads (%d)\n",
                o->c.width, o->c.n_head);
        exit(1);
    }
    if (o->c.sinpos && o->c.width % 2) {
        fprintf(stderr, "char_gpt: --sinpos needs an even --width (got %d)\n", o->c.width);
        exit(1);
    }
    if (o->c.rope && ((o->c.width / o->c.n_head) % 2 || o->c.sinpos)) {
        fprintf(stderr, "char_gpt: --rope needs an even head width (--width / --heads, got "
                        "%d) and no --sinpos\n",
                o->c.width / o->c.n_head);
        exit(1);
    }
    if (strcmp(o->amp, "none") && strcmp(o->amp, "bf16") && strcmp(o->amp, "fp8")) {
        fprintf(stderr, "char_gpt: --amp must be none, bf16 or fp8 (got '%s')\n", o->amp);
        exit(1);
    }
    o->t.amp = strcmp(o->amp, "bf16") ? NT_DTYPE_COUNT : NT_BF16;
    if (o->mesh)
        mesh_refuse(o);
    if (o->reshard && (!o->mesh || !o->resume)) {
        fprintf(stderr, "char_gpt: --reshard needs --resume and a device mesh "
                        "(--dp/--tp/--zero/--ep): a plain run's checkpoint has one layout\n");
        exit(1);
    }
    if (o->backend && strcmp(o->backend, "sim") && strcmp(o->backend, "cpu")) {
        fprintf(stderr, "char_gpt: --backend must be sim or cpu (got '%s')\n", o->backend);
        exit(1);
    }
}

/* Prints the prompt and n sampled characters (seed fixed), feeding the
 * last `context` characters back each time. */
static void generate(gpt_model *m, const gpt_data *d, const char *prompt, int n, uint64_t seed)
{
    int T = m->c.context;
    size_t plen = strlen(prompt);
    int32_t *ctx = malloc(sizeof *ctx * (plen + (size_t)n + 1));
    if (!ctx) {
        fprintf(stderr, "char_gpt: out of memory\n");
        exit(1);
    }
    size_t len = 0;
    for (size_t i = 0; i < plen; i++) {
        int id = d->stoi[(uint8_t)prompt[i]];
        if (id < 0) {
            fprintf(stderr, "char_gpt: --prompt: the character '%c' does not occur in the "
                            "training text\n",
                    prompt[i]);
            exit(1);
        }
        ctx[len++] = id;
    }
    if (len == 0)
        ctx[len++] = d->stoi['\n'] >= 0 ? d->stoi['\n'] : 0;
    printf("sample (%d characters, seed %llu):\n%s", n, (unsigned long long)seed, prompt);
    nt_no_grad_begin();
    for (int i = 0; i < n; i++) {
        int t = len < (size_t)T ? (int)len : T;
        nt_scope *sc = nt_scope_begin();
        nt_tensor *x = nt_from_host(ctx + len - t, NT_I32, 2, (int64_t[]){1, t});
        nt_tensor *last = nt_slice(gpt_logits(m, x), 0, t - 1, t, 1);
        /* the draw on the device: nt_multinomial's counter-based uniform of
         * (seed + i), inverse CDF over the softmax -- one sync per character */
        int32_t c;
        check(nt_to_host(nt_multinomial(nt_softmax(last, 1), 1, seed + (uint64_t)i), &c,
                         sizeof c),
              "sampling");
        nt_scope_end(sc);
        ctx[len++] = c;
        putchar(d->itos[c]);
    }
    nt_no_grad_end();
    printf("\n");
    free(ctx);
}

/* The latest simulated clock over this process's cores, after a sync (ns). */
static double mesh_clock(void)
{
    check(nt_sync(), "nt_sync");
    double m = 0;
    for (int i = 0; i < nt_device_count(); i++) {
        nt_sim_stats st;
        if (nt_device_stats_get(i, &st) == 0 && st.clock_ns > m)
            m = st.clock_ns;
    }
    return m;
}

/* The MoE load statistics since the last log line: tokens per expert of
 * every layer's router, summed over the layers and the ns shards, as a
 * share of the assignments; then reset. */
static void mesh_load(gpt_mesh *g, bool print, int64_t ns)
{
    int32_t cnt[256] = {0};
    int E = g->experts < 256 ? g->experts : 256;
    check(nt_to_host(g->load, cnt, sizeof *cnt * (size_t)E), "reading the load statistics");
    check(nt_fill_inplace(g->load, 0), "resetting the load statistics");
    if (!print)
        return;
    int64_t total = 0, mx = 0;
    for (int e = 0; e < E; e++)
        total += cnt[e], mx = cnt[e] > mx ? cnt[e] : mx;
    printf("  load: tokens per expert (%lld shard-steps x %d layers):", (long long)ns,
           g->c.n_layer);
    for (int e = 0; e < E; e++)
        printf(" %d", cnt[e]);
    printf("  (max/mean %.2f)\n", total ? (double)mx * E / (double)total : 0.0);
}

/* A mesh run's error before its steps: "char_gpt: <what><msg>" on stderr,
 * the mesh freed and the runtime shut down; returns mesh_main's 1. */
static int mesh_quit(gpt_mesh *g, const char *what, const char *msg)
{
    fprintf(stderr, "char_gpt: %s%s\n", what, msg);
    gptm_free(g);
    nt_shutdown();
    return 1;
}

/* Training under a dp x tp mesh (examples/gpt_mesh.h): prints the loss
 * and eval lines as the plain run does, the simulated and host time per
 * step (from step 2 on, evaluations left out) and the parameters' CRC-32. */
static int mesh_main(options *o, gpt_data *d)
{
    char err[512];
    int V = o->c.vocab;
    o->c.vocab = (V + o->blocks - 1) / o->blocks * o->blocks; /* padded: unused ids */
    if (o->ep > 1 && !o->experts)
        o->experts = 8;
    if (o->experts && !o->topk)
        o->topk = 2;
    if (gptm_check(&o->c, o->dp, o->tp, o->zero, o->blocks, o->shards, o->t.batch, err,
                   sizeof err) ||
        (o->experts && gptm_check_moe(&o->c, o->tp, o->ep, o->experts, o->topk, o->shards,
                                      o->t.batch, err, sizeof err))) {
        fprintf(stderr, "char_gpt: %s\n", err);
        return 1;
    }
    if (!getenv("NT_SIM_CORES")) {
        /* one core per mesh rank, over the processes mpirun started */
        const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
        int np = ws ? atoi(ws) : 1, cores = o->dp * o->tp * (o->experts ? o->ep : 1);
        char buf[16];
        snprintf(buf, sizeof buf, "%d", np > 0 && cores % np == 0 ? cores / np : cores);
        setenv("NT_SIM_CORES", buf, 1);
    }
    check(nt_init(), "nt_init");
    gpt_mesh g;
    if (gptm_init_moe(&g, &o->c, o->dp, o->tp, o->ep, o->experts, o->topk, o->zero, o->blocks,
                      o->shards, &o->t, err, sizeof err))
        return mesh_quit(&g, "", err);
    if ((o->keep_gathered && gptm_set_release(&g, false, err, sizeof err)) ||
        gptm_set_sp(&g, o->sp, err, sizeof err) ||
        gptm_set_dropout(&g, o->c.dropout, err, sizeof err))
        return mesh_quit(&g, "", err);
    const char *nocap = o->capture ? gptm_capture_refusal(&g) : NULL;
    if (nocap)
        return mesh_quit(&g, "--capture is not supported under a mesh with ", nocap);
    int64_t end = o->limit_steps && o->limit_steps < o->t.steps ? o->limit_steps : o->t.steps;
    bool main_proc = nt_process_rank() == 0;
    if (main_proc && (o->sp || o->c.dropout > 0))
        printf("sequence parallelism %s, dropout %g\n", o->sp ? "on" : "off", o->c.dropout);
    if (main_proc)
        printf("mesh: data %d x tensor %d (%d cores in %d process(es)), ZeRO stage %d, %d "
               "shards of %d sequences, %d blocks; vocabulary %d padded to %d; %d layers, %d "
               "heads, width %d, context %d; %lld steps, AdamW lr %g, clip %g; mode %s, "
               "backend %s, amp %s\n",
               o->dp, o->tp, nt_mesh_size(g.mesh, NULL), nt_process_count(), o->zero,
               o->shards, o->t.batch / o->shards, o->blocks, V, o->c.vocab, o->c.n_layer,
               o->c.n_head, o->c.width, o->c.context, (long long)o->t.steps, o->t.lr, o->t.clip,
               nt_config_get("NT_MODE"), nt_config_get("NT_BACKEND"), o->amp);
    if (main_proc && o->experts)
        printf("MoE MLP: %d experts (hidden %d each) over expert %d, top-%d of a softmax "
               "router, load-balancing loss x %g\n", o->experts, 4 * o->c.width, g.ep, o->topk,
               g.auxw);
    int B = o->t.batch, T = o->c.context;
    int32_t *xb = malloc(sizeof *xb * (size_t)B * T), *yb = malloc(sizeof *yb * (size_t)B * T);
    nt_tensor *loss_sum = nt_zeros(NT_F32, 0, NULL);
    if (!xb || !yb || !loss_sum)
        check(-1, "allocating the batch");
    int64_t start = 0;
    if (o->resume) {
        /* the same layout, or any other with --reshard (examples/gpt_mesh.h) */
        if (gptm_load(&g, o->resume, o->reshard, err, sizeof err))
            return mesh_quit(&g, "--resume: ", err);
        start = nt_optim_steps(g.opt[0][0]);
        g.step = (uint64_t)start; /* dropout's masks are keyed on the step */
        if (main_proc)
            printf("resumed from %s at step %lld\n", o->resume, (long long)start);
    }
    int local = 0; /* this process's shards */
    for (int s = 0; s < o->shards; s++)
        local += nt_ddp_shard_device(g.ddp[0], s) >= 0;
    double sim = 0, host = 0, mark = 0, hmark = 0, val = NAN;
    int64_t timed = 0, n_log = 0;
    gptm_capture cap = {0}; /* --capture: the second step recorded, replayed after */
    for (int64_t step = start; step < end; step++) {
        gpt_batch(d, false, o->t.seed, step, B, T, xb, yb);
        /* the first step op by op: AdamW's moments exist before the capture */
        if (o->capture && step > start) {
            bool first = !cap.graph;
            if (gptm_captured_step(&g, &o->t, xb, yb, loss_sum, &cap))
                check(-1, "captured training step");
            nt_graph_info gi;
            if (first && main_proc && nt_graph_info_get(cap.graph, &gi) == 0)
                printf("captured step %lld over %d cores: %lld ops in %lld kernels\n",
                       (long long)step + 1, nt_device_count(), (long long)gi.ops,
                       (long long)gi.kernels);
        } else if (gptm_step(&g, &o->t, xb, yb, loss_sum)) {
            check(-1, "training step");
        }
        n_log++;
        if (step == start)
            mark = mesh_clock(), hmark = now_s();
        else
            timed++;
        bool last = step + 1 == end, eval = (step + 1) % o->eval_every == 0 || last;
        bool log = o->log_every && (step + 1) % o->log_every == 0;
        if (!log && !eval)
            continue;
        double c = mesh_clock(), h = now_s(), sv;
        if (step > start)
            sim += c - mark, host += h - hmark;
        check(nt_item(loss_sum, &sv), "reading the loss");
        check(nt_fill_inplace(loss_sum, 0), "resetting the loss sum");
        if (log && main_proc)
            printf("step %5lld/%lld  loss %.4f  lr %.2e\n", (long long)step + 1,
                   (long long)o->t.steps, sv / (n_log * local), nt_optim_get_lr(g.opt[0][0]));
        if (log && g.load)
            mesh_load(&g, main_proc, n_log * local);
        n_log = 0;
        if (eval) {
            val = gptm_eval(&g, d, &o->t, o->eval_batches);
            if (isnan(val))
                check(-1, "evaluation");
            if (main_proc)
                printf("eval step=%lld val=%.4f\n", (long long)step + 1, val);
            if (o->save) {
                if (gptm_save(&g, o->save, err, sizeof err)) {
                    fprintf(stderr, "char_gpt: --save: %s\n", err);
                    return 1;
                }
                if (main_proc)
                    printf("saved %s at step %lld\n", o->save, (long long)step + 1);
            }
        }
        fflush(stdout);
        mark = mesh_clock(), hmark = now_s();
    }
    uint32_t crc = 0;
    if (gptm_crc(&g, &crc, err, sizeof err)) {
        fprintf(stderr, "char_gpt: %s\n", err);
        return 1;
    }
    if (main_proc) {
        if (timed > 0)
            printf("mesh step time (steps %lld..%lld, evaluations left out): NeuronCore "
                   "(simulated) %.3f ms/step, host %.1f ms/step\n", (long long)start + 2,
                   (long long)end,
                   sim * 1e-6 / timed, host * 1e3 / timed);
        printf("final val loss %.4f after %lld steps\n", val, (long long)end);
        printf("activations: %.3f MiB on tensor rank 0's core (what a shard's forward "
               "keeps for the backward: nt_device_bytes_live's growth, largest over the "
               "steps); live then %.3f MiB\n", (double)g.act_bytes / 1048576.0,
               (double)g.live_bytes / 1048576.0);
        if (o->experts && o->tp > 1)
            printf("params crc32 %08x (dp %d, tp %d, ep %d, zero %d; MoE %d experts, top-%d)\n",
                   crc, o->dp, o->tp, g.ep, o->zero, o->experts, o->topk);
        else if (o->experts)
            printf("params crc32 %08x (dp %d, ep %d, zero %d; MoE %d experts, top-%d)\n", crc,
                   o->dp, g.ep, o->zero, o->experts, o->topk);
        else
            printf("params crc32 %08x (dp %d, tp %d, zero %d%s)\n", crc, o->dp, o->tp, o->zero,
                   o->sp ? ", sp" : "");
    }
    gptm_capture_free(&cap);
    nt_release(loss_sum);
    free(xb);
    free(yb);
    gptm_free(&g);
    nt_shutdown();
    return 0;
}

int main(int argc, char **argv)
{
    options o = {.c = {.n_layer = 4, .n_head = 4, .width = 128, .context = 128},
                 .t = {.batch = 16, .lr = 2e-3, .clip = 1.0, .steps = 300, .warmup = 30,
                       .seed = 1},
                 .eval_every = 50, .eval_batches = 8, .log_every = 10, .sample = 300,
                 .prompt = "The ", .data = GPT_DATA_DIR, .amp = "none",
                 .dp = 1, .tp = 1, .ep = 1, .blocks = 4, .shards = 8};
    parse_args(argc, argv, &o);
    double t_start = now_s();
    gpt_data d;
    if (gpt_data_load(&d, o.data) != 0)
        return 1;
    if (d.n - d.n_train <= o.c.context + 1) {
        fprintf(stderr, "char_gpt: --context %d is longer than the validation text\n",
                o.c.context);
        return 1;
    }
    o.c.vocab = d.vocab;
    if (o.backend)
        setenv("NT_BACKEND", o.backend, 1); /* read by nt_init */
    if (o.mesh) {
        int rc = mesh_main(&o, &d);
        gpt_data_free(&d);
        return rc;
    }
    check(nt_init(), "nt_init");
    if (!strcmp(o.amp, "fp8")) {
        /* delayed scaling, e4m3 forward and e5m2 gradients (docs/amp.md) */
        o.t.fp8 = nt_fp8_recipe_create(NULL);
        if (!o.t.fp8)
            check(-1, "nt_fp8_recipe_create");
    }
    gpt_model m;
    check(gpt_init(&m, &o.c, o.t.seed), "initialising the model");
    int64_t nparam = 0;
    for (int i = 0; i < m.n_params; i++)
        nparam += nt_numel(m.p[i]);
    printf("char_gpt: %lld characters from %d files of %s, vocabulary %d, %lld train / %lld "
           "validation\n",
           (long long)d.n, d.files, o.data, d.vocab, (long long)d.n_train,
           (long long)(d.n - d.n_train));
    printf("model: %d layers, %d heads, width %d, context %d, %s head, dropout %g: %lld "
           "parameters\n",
           o.c.n_layer, o.c.n_head, o.c.width, o.c.context, o.c.untied ? "untied" : "tied",
           o.c.dropout, (long long)nparam);
    if (o.c.rope)
        printf("positions: rotary (nt_rope of q and k in every block, GPT-NeoX layout, base "
               "10000); wpe unused\n");
    printf("training: %lld steps of batch %d, AdamW lr %g (warm-up %lld, cosine to %g; "
           "weight decay 0.1 on matrices and embeddings, none on norms and biases), "
           "clip 1.0, seed %llu; mode %s, backend %s, amp %s\n",
           (long long)o.t.steps, o.t.batch, o.t.lr, (long long)o.t.warmup, o.t.lr * 0.1,
           (unsigned long long)o.t.seed, nt_config_get("NT_MODE"), nt_config_get("NT_BACKEND"),
           o.amp);
    /* weight decay on matrices and embeddings, none on norms and biases;
     * the cosine schedule with warm-up as o.t.sched */
    nt_optim *opt = gpt_optimizer(&m, &o.t, 0.1);
    if (!opt)
        check(-1, "gpt_optimizer");
    int64_t start = 0;
    /* checkpoints name each tensor as GPT-2's state_dict does */
    const char **names = gpt_param_names(&m);
    if (!names)
        check(-1, "the parameters' names");
    /* --amp fp8: the recipe's scales and amax histories too (a resumed run
     * continues with the uninterrupted run's bits) */
    nt_checkpoint_spec ck = {.tensors = m.p, .names = names, .n = m.n_params, .opt = opt,
                             .fp8 = o.t.fp8};
    if (o.resume) {
        /* a file from before names loads by position */
        nt_checkpoint_entry *ent;
        int nent;
        check(nt_checkpoint_list(o.resume, &ent, &nent), "--resume");
        bool named = nent > 0 && strcmp(ent[0].name, "0") != 0, mesh = false;
        for (int i = 0; i < nent; i++)
            mesh = mesh || !strcmp(ent[i].name, "mesh.layout");
        nt_checkpoint_list_free(ent, nent);
        if (mesh) {
            fprintf(stderr, "char_gpt: --resume: '%s' is a mesh checkpoint (--dp/--tp/--zero/"
                            "--ep): the mesh model's parameters are laid out and summed "
                            "otherwise; resume it under a mesh (its 1-core form: --dp 1 --tp "
                            "1 --reshard)\n", o.resume);
            return 1;
        }
        check(named ? nt_checkpoint_read(o.resume, &ck, true, NULL)
                    : nt_load(o.resume, m.p, m.n_params, opt),
              "--resume");
        start = nt_optim_steps(opt);
        printf("resumed from %s at step %lld\n", o.resume, (long long)start);
    }
    int B = o.t.batch, T = o.c.context;
    int32_t *xb = malloc(sizeof *xb * (size_t)B * T), *yb = malloc(sizeof *yb * (size_t)B * T);
    if (!xb || !yb) {
        fprintf(stderr, "char_gpt: out of memory\n");
        return 1;
    }
    /* Losses are summed on the device and read at log lines only: a step
     * never waits for the device. */
    nt_tensor *loss_sum = nt_zeros(NT_F32, 0, NULL);
    double eval_sum = 0, t_log = now_s(), t_eval = t_log, t_train = 0;
    int64_t n_log = 0, n_eval = 0;
    nt_sim_stats sim_log, sim_all0, sim_now;
    nt_sim_stats_get(&sim_log);
    sim_all0 = sim_log;
    double val = NAN;
    int64_t end = o.limit_steps && o.limit_steps < o.t.steps ? o.limit_steps : o.t.steps;
    gpt_capture cap = {0}; /* --capture: step 1 recorded, replayed after */
    for (int64_t step = start; step < end; step++) {
        nt_tensor *loss;
        if (!o.capture) {
            loss = gpt_train_step(&m, opt, &d, &o.t, step, xb, yb);
        } else {
            bool first = !cap.graph;
            loss = gpt_captured_step(&m, opt, &d, &o.t, step, xb, yb, &cap);
            nt_graph_info gi;
            if (loss && first && nt_graph_info_get(cap.graph, &gi) == 0)
                printf("captured step %lld: %lld ops in %lld kernels; memory plan %.1f MiB for "
                       "%lld intermediates (%.1f MiB without reuse)\n",
                       (long long)step + 1, (long long)gi.ops, (long long)gi.kernels,
                       gi.plan_bytes / 1048576.0, (long long)gi.planned,
                       gi.naive_bytes / 1048576.0);
        }
        if (!loss)
            check(-1, "training step");
        nt_no_grad_begin();
        check(nt_add_inplace(loss_sum, loss), "summing the loss");
        nt_no_grad_end();
        nt_release(loss);
        n_log++;
        n_eval++;
        bool last = step + 1 == end, eval = (step + 1) % o.eval_every == 0 || last;
        if ((o.log_every && (step + 1) % o.log_every == 0) || eval) {
            double s;
            check(nt_item(loss_sum, &s), "reading the loss");
            check(nt_fill_inplace(loss_sum, 0), "resetting the loss sum");
            double now = now_s(), dt = now - t_log;
            nt_sim_stats_get(&sim_now);
            double sim_ns = sim_now.sim_ns - sim_log.sim_ns;
            eval_sum += s;
            t_train += dt;
            if (o.log_every && (step + 1) % o.log_every == 0) {
                printf("step %5lld/%lld  loss %.4f  lr %.2e  %6.0f tok/s  %7.1f ms/step",
                       (long long)step + 1, (long long)o.t.steps, s / n_log,
                       nt_optim_get_lr(opt), (double)B * T * n_log / dt, 1e3 * dt / n_log);
                if (sim_ns > 0)
                    printf("  NeuronCore (simulated) %.3f ms/step, MFU %.1f%%",
                           sim_ns * 1e-6 / n_log,
                           100.0 * (sim_now.tensor_ideal_ns - sim_log.tensor_ideal_ns) / sim_ns);
                printf("\n");
            }
            n_log = 0;
            if (eval) {
                val = gpt_eval_fp8(&m, &d, B, o.eval_batches, o.t.amp, o.t.fp8);
                if (isnan(val))
                    check(-1, "evaluation");
                printf("eval step=%lld train=%.4f val=%.4f ms_per_step=%.1f\n",
                       (long long)step + 1, eval_sum / n_eval, val,
                       1e3 * (now - t_eval) / n_eval);
                eval_sum = 0;
                n_eval = 0;
                if (o.save) {
                    check(nt_checkpoint_write(o.save, &ck), "--save");
                    printf("saved %s at step %lld\n", o.save, (long long)step + 1);
                }
            }
            fflush(stdout);
            nt_sim_stats_get(&sim_log); /* the evaluation is not a training step */
            t_log = now_s();
            if (eval)
                t_eval = t_log;
        }
    }
    nt_sim_stats_get(&sim_now);
    int64_t ran = end > start ? end - start : 0;
    if (ran > 0) {
        printf("trained %lld steps: %.0f tok/s, %.1f ms/step", (long long)ran,
               (double)B * T * ran / t_train, 1e3 * t_train / ran);
        double sim_ns = sim_now.sim_ns - sim_all0.sim_ns; /* includes the evaluations */
        if (sim_ns > 0)
            printf("; NeuronCore (simulated, evaluations included) %.3f s, MFU %.1f%%",
                   sim_ns * 1e-9,
                   100.0 * (sim_now.tensor_ideal_ns - sim_all0.tensor_ideal_ns) / sim_ns);
        printf("\n");
    } else {
        val = gpt_eval_fp8(&m, &d, B, o.eval_batches, o.t.amp, o.t.fp8);
        printf("eval step=%lld train=nan val=%.4f ms_per_step=nan\n", (long long)start, val);
    }
    printf("final val loss %.4f after %lld steps (%.1f s wall)\n", val,
           (long long)nt_optim_steps(opt), now_s() - t_start);
    gpt_capture_free(&cap);
    if (o.sample > 0)
        generate(&m, &d, o.prompt, o.sample, 1234);
    nt_release(loss_sum);
    gpt_optimizer_free(opt, &o.t);
    nt_fp8_recipe_destroy(o.t.fp8);
    free(names);
    gpt_free(&m);
    gpt_data_free(&d);
    free(xb);
    free(yb);
    nt_shutdown();
    return 0;
}
