#include "backend/cpu/selection_margin.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

namespace dsv4::cpu {
namespace {
std::atomic<bool> g_on{false};
std::atomic<double> g_min{std::numeric_limits<double>::infinity()};
}  // namespace

void selection_margin_track(bool on) {
  g_on.store(on);
  selection_margin_reset();
}
void selection_margin_reset() { g_min.store(std::numeric_limits<double>::infinity()); }
double selection_margin() { return g_min.load(); }

bool selection_margin_tracking() { return g_on.load(std::memory_order_relaxed); }

void note_selection_gap(float a, float b, float scale) {
  if (!selection_margin_tracking()) return;
  const double s = std::max({std::fabs(double(a)), std::fabs(double(b)), std::fabs(double(scale))});
  const double m = s > 0 ? (double(a) - double(b)) / s : 0.0;
  double cur = g_min.load();
  while (m < cur && !g_min.compare_exchange_weak(cur, m)) {
  }
}

}  // namespace dsv4::cpu
