"""``train/profiling.kernel_summary``: a GPU trace's device time per step, by kernel class, from the chrome trace
``zerobench train --profile`` writes (a synthetic one here: a CPU run's trace has no kernels)."""

from __future__ import annotations

import pytest

from zerobench.train.profiling import kernel_class, kernel_summary


def _x(name, cat, ts, dur):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


def test_classes_follow_cuda_kernel_names():
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "matmul"
    assert kernel_class("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert kernel_class("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>") == "attention"
    assert kernel_class("triton_per_fused_add_native_layer_norm_0") == "compiled (triton)"
    assert kernel_class("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>") == (
        "norm / softmax / reduce"
    )
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>") == "elementwise"
    assert kernel_class("ncclDevKernel_AllGather_RING_LL") == "communication"
    assert kernel_class("void multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>") == ("optimizer")
    assert kernel_class("mystery") == "other"


def test_two_steps_split_into_classes_busy_time_and_top_kernels():
    trace = {
        "traceEvents": [
            _x("ProfilerStep#5", "user_annotation", 0, 1000),
            _x("ProfilerStep#6", "user_annotation", 1000, 1000),
            # a GPU trace repeats each step as the device ran it: not more steps
            _x("ProfilerStep#5", "gpu_user_annotation", 0, 800),
            _x("ProfilerStep#6", "gpu_user_annotation", 1000, 600),
            # step 1: a GEMM overlapping a copy on another stream, then an elementwise kernel; 300 us idle
            _x("ampere_bf16_s16816gemm", "kernel", 0, 500),
            _x("Memcpy DtoD", "gpu_memcpy", 400, 200),
            _x("vectorized_elementwise_kernel", "kernel", 600, 100),
            # step 2: the same GEMM, and a compiled kernel
            _x("ampere_bf16_s16816gemm", "kernel", 1000, 500),
            _x("triton_poi_fused_gelu_1", "kernel", 1500, 300),
            _x("cudaLaunchKernel", "cuda_runtime", 0, 5),  # host-side: not device time
        ]
    }
    s = kernel_summary(trace, top=2)
    assert s["steps"] == 2 and s["step_ms"] == pytest.approx(1.0) and s["device_step_ms"] == pytest.approx(0.7)
    assert s["kernel_ms"] == pytest.approx((500 + 200 + 100 + 500 + 300) / 2e3)
    assert s["device_busy_ms"] == pytest.approx((700 + 800) / 2e3)  # the overlap counted once
    assert s["by_class_ms"] == pytest.approx(
        {"matmul": 0.5, "compiled (triton)": 0.15, "memcpy / memset": 0.1, "elementwise": 0.05}
    )
    assert list(s["by_class_ms"]) == ["matmul", "compiled (triton)", "memcpy / memset", "elementwise"]
    assert s["top_kernels"][0] == {
        "name": "ampere_bf16_s16816gemm",
        "class": "matmul",
        "calls_per_step": 1.0,
        "ms": 0.5,
    }
    assert len(s["top_kernels"]) == 2


def test_a_trace_without_kernels_is_refused_in_one_line():
    with pytest.raises(ValueError, match="needs a GPU trace"):
        kernel_summary({"traceEvents": [_x("ProfilerStep#1", "user_annotation", 0, 10)]})
