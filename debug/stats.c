/* debug/stats.c - the NT_STATS=1 summary printed by nt_shutdown.
 *
 *   ntensor stats:
 *     ops         1200 enqueued, 1200 executed, 0 skipped (poisoned input)
 *     kernels     180 run: 100 fused running 1120 ops (11.2 ops/kernel), 80 single ops
 *     ...
 *
 * Everything comes from nt_stats_get (and nt_sim_stats_get when the
 * runtime drives the simulator), so the numbers match the API's. */
#include "debug/debug.h"

#include "core/backend.h"

static const char *bytes_str(double b, char *buf, size_t n)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4)
        b /= 1024, u++;
    if (u == 0)
        snprintf(buf, n, "%.0f B", b);
    else
        snprintf(buf, n, "%.1f %s", b, unit[u]);
    return buf;
}

static double pct(double a, double b) { return b > 0 ? 100.0 * a / b : 0.0; }

void nt__debug_stats_print(FILE *f)
{
    nt_stats st;
    if (nt_stats_get(&st) != 0)
        return;
    char b1[32], b2[32], b3[32];
    /* a foreach kernel ran foreach_programs groups and single ops as one */
    uint64_t runs = st.kernels_launched + st.foreach_programs - st.foreach_kernels;
    uint64_t single = runs >= st.fusion_groups ? runs - st.fusion_groups : 0;
    fprintf(f, "ntensor stats:\n");
    fprintf(f, "  ops         %llu enqueued, %llu executed, %llu skipped (poisoned input)\n",
            (unsigned long long)st.ops_enqueued, (unsigned long long)st.ops_executed,
            (unsigned long long)st.ops_poisoned);
    fprintf(f, "  kernels     %llu run: %llu fused running %llu ops (%.1f ops/kernel), %llu single "
            "ops; %.2f ops/kernel overall\n",
            (unsigned long long)st.kernels_launched, (unsigned long long)st.fusion_groups,
            (unsigned long long)st.fused_ops,
            st.fusion_groups ? (double)st.fused_ops / (double)st.fusion_groups : 0.0,
            (unsigned long long)single,
            st.kernels_launched ? (double)st.ops_executed / (double)st.kernels_launched : 0.0);
    if (st.foreach_kernels)
        fprintf(f, "  foreach     %llu kernels running %llu programs (%.1f a kernel)\n",
                (unsigned long long)st.foreach_kernels, (unsigned long long)st.foreach_programs,
                (double)st.foreach_programs / (double)st.foreach_kernels);
    uint64_t lookups = st.kernel_cache_hits + st.kernel_cache_misses;
    fprintf(f, "  fusion      %llu breaks; kernel cache %llu hits, %llu misses (%.1f%% hits); "
            "%llu values written, %llu intermediates elided; planning %.3f ms\n",
            (unsigned long long)st.fusion_breaks, (unsigned long long)st.kernel_cache_hits,
            (unsigned long long)st.kernel_cache_misses,
            pct((double)st.kernel_cache_hits, (double)lookups),
            (unsigned long long)st.fused_values_stored,
            (unsigned long long)st.fused_values_elided, (double)st.fusion_plan_ns / 1e6);
    fprintf(f, "  syncs       %llu, %.3f ms waiting (%.1f us per sync)\n",
            (unsigned long long)st.syncs, (double)st.sync_wait_ns / 1e6,
            st.syncs ? (double)st.sync_wait_ns / 1e3 / (double)st.syncs : 0.0);
    fprintf(f, "  host        %s to host, %s from host\n",
            bytes_str((double)st.bytes_to_host, b1, sizeof b1),
            bytes_str((double)st.bytes_from_host, b2, sizeof b2));
    fprintf(f, "  device      peak %s of %s, %s in use; %llu ops on the CPU backend\n",
            bytes_str((double)st.device_bytes_peak, b1, sizeof b1),
            bytes_str((double)st.device_capacity, b2, sizeof b2),
            bytes_str((double)st.device_bytes_in_use, b3, sizeof b3),
            (unsigned long long)st.cpu_fallbacks);
    char b4[32];
    fprintf(f, "  memory      peak %s reserved, %s live, %s backed; %s waiting for queued ops "
            "now; %llu allocations waited (%.3f ms)\n",
            bytes_str((double)st.device_bytes_peak, b1, sizeof b1),
            bytes_str((double)st.device_bytes_live_peak, b2, sizeof b2),
            bytes_str((double)st.device_bytes_backed_peak, b3, sizeof b3),
            bytes_str((double)st.device_bytes_waiting, b4, sizeof b4),
            (unsigned long long)st.device_alloc_waits, (double)st.device_alloc_wait_ns / 1e6);

    if (st.graph_replays) {
        double n = (double)st.graph_replays;
        fprintf(f, "  graphs      %llu replays of captured programs, %.0f ops in %.0f kernels a "
                "replay; largest memory plan %s\n",
                (unsigned long long)st.graph_replays, (double)st.graph_ops_replayed / n,
                (double)st.graph_kernels_replayed / n,
                bytes_str((double)st.graph_plan_bytes, b1, sizeof b1));
        if (st.graph_sim_ns) {
            static const char *eng[5] = {"TensorE", "VectorE", "ScalarE", "GpSimd", "DMA"};
            double sim = (double)st.graph_sim_ns;
            fprintf(f, "              simulated %.3f ms a replay, MFU %.1f%%, HBM %s a replay;",
                    sim / n / 1e6, pct(st.graph_sim_ideal_ns, sim),
                    bytes_str((double)st.graph_sim_hbm_bytes / n, b1, sizeof b1));
            for (int e = 0; e < 5; e++)
                fprintf(f, "%s %s %.1f%%", e ? "," : "", eng[e],
                        pct(st.graph_sim_busy_ns[e], sim));
            fprintf(f, "\n");
        }
    }
    /* The simulator's totals, when the runtime runs kernels on it (asking
     * otherwise would start a simulator just to print zeros). */
    nt_sim_stats ss;
    if (!nt__backends[NT_BACKEND_SIM] || NT__CFG(backend) != NT_BACKEND_SIM || nt_sim_stats_get(&ss) != 0)
        return;
    fprintf(f, "  simulator   %llu kernels, %llu instructions, %.3f ms simulated (host %.3f ms "
            "inside kernels)\n",
            (unsigned long long)ss.kernels, (unsigned long long)ss.instructions,
            ss.sim_ns / 1e6, ss.host_ns / 1e6);
    fprintf(f, "  utilisation");
    for (int e = 0; e < NT_ENGINE_COUNT; e++)
        fprintf(f, "%s %s %.1f%%", e ? "," : "", nt_engine_name((nt_engine)e),
                100.0 * ss.utilization[e]);
    fprintf(f, "; HBM %s read, %s written (%.1f%% of peak bandwidth); MFU %.1f%%\n",
            bytes_str((double)ss.hbm_read_bytes, b1, sizeof b1),
            bytes_str((double)ss.hbm_write_bytes, b2, sizeof b2), 100.0 * ss.hbm_bw_utilization,
            100.0 * ss.mfu);
}
