// Test instrumentation of the CPU reference's discrete choices. While tracking is on, every top-k selection
// (cpu::topk_row for the indexer, cpu::moe_route's expert choice) reports the relative gap between its last
// selected and its first unselected score, and selection_margin() returns the smallest since the last reset.
// A GPU-vs-CPU comparison uses it to tell a near tie (a choice that a 1e-7 perturbation of the scores can
// flip, after which the two runs compute different functions) from a kernel error. Off by default: then the
// selections cost nothing extra.
#pragma once

namespace dsv4::cpu {

void selection_margin_track(bool on);  // also resets
void selection_margin_reset();         // to +inf
double selection_margin();
// (a - b) / scale for the last selected score a and the first unselected b (0 for an exact tie), scale = the
// largest |score| of the row (a gap between two scores near zero is small against the row's rounding errors).
void note_selection_gap(float a, float b, float scale);
// Whether tracking is on (callers skip the work of finding the gap otherwise).
bool selection_margin_tracking();

}  // namespace dsv4::cpu
