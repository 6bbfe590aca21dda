#include <gtest/gtest.h>
#include "core/numerics.h"
TEST(Numerics, Placeholder) { EXPECT_EQ(dsv4::fp8_e4m3_to_f32(0x38), 1.0f); }
