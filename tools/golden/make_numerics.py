#!/usr/bin/env python3
"""Numerics fixtures from independent implementations: torch's float8_e4m3fn / float8_e8m0fnu / bfloat16
casts and transformers' MXFP4 decoder (integrations/mxfp4.py, written for gpt-oss: e2m1 codes packed two
per byte, UE8M0 scale per 32). Usage: python3 tools/golden/make_numerics.py [--out fixtures/numerics]"""
import argparse
import json
import os

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "numerics"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    codes = torch.arange(256, dtype=torch.uint8)
    codes.view(torch.float8_e4m3fn).float().numpy().astype("<f4").tofile(os.path.join(args.out, "fp8_e4m3_decode.f32"))
    codes.view(torch.float8_e8m0fnu).float().numpy().astype("<f4").tofile(os.path.join(args.out, "e8m0_decode.f32"))

    g = torch.Generator().manual_seed(7)
    # e4m3 encode: random values in range, exact midpoints between neighbours (ties), subnormals, zeros.
    fp8_all = codes.view(torch.float8_e4m3fn).float()
    finite = fp8_all[torch.isfinite(fp8_all)].unique()
    mids = (finite[1:] + finite[:-1]) / 2
    x = torch.cat([torch.randn(2000, generator=g) * 50, torch.rand(500, generator=g) * 0.02, mids, -mids,
                   torch.tensor([0.0, -0.0, 448.0, -448.0, 1e-9])])
    x.numpy().astype("<f4").tofile(os.path.join(args.out, "fp8_encode_in.f32"))
    x.to(torch.float8_e4m3fn).view(torch.uint8).numpy().tofile(os.path.join(args.out, "fp8_encode_out.u8"))
    # bf16 encode (round to nearest even), including exact ties.
    y = torch.cat([torch.randn(2000, generator=g) * 1e3,
                   (torch.randint(0, 2**16, (500,), generator=g).to(torch.int32) << 16 | 0x8000).view(torch.float32)])
    y = y[torch.isfinite(y)]
    y.numpy().astype("<f4").tofile(os.path.join(args.out, "bf16_encode_in.f32"))
    y.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tofile(os.path.join(args.out, "bf16_encode_out.i16"))
    # MXFP4: 8 rows x 128 values = 64 bytes per row, 4 scales per row.
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    rows, cols = 8, 128
    packed = torch.randint(0, 256, (rows, cols // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(120, 134, (rows, cols // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    # gpt-oss layout: [experts, rows, groups, 16 bytes]; the function returns [experts, cols, rows].
    deq = convert_moe_packed_tensors(packed.view(1, rows, cols // 32, 16), scales.view(1, rows, cols // 32),
                                     dtype=torch.float32)[0].T.contiguous()
    packed.numpy().tofile(os.path.join(args.out, "fp4_packed.u8"))
    scales.numpy().tofile(os.path.join(args.out, "fp4_scales.u8"))
    deq.numpy().astype("<f4").tofile(os.path.join(args.out, "fp4_decode.f32"))
    with open(os.path.join(args.out, "README.json"), "w") as f:
        json.dump({"torch": torch.__version__, "fp4_rows": rows, "fp4_cols": cols,
                   "fp4_reference": "transformers.integrations.mxfp4.convert_moe_packed_tensors"}, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
