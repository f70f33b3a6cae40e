# Sourced by every script of benchmarks/gpu, from the repository root (`source benchmarks/gpu/env.sh`):
# the checkout on PYTHONPATH, unbuffered output, and NVLink multicast off in NCCL, PyTorch and NVSHMEM
# (a program that turns it on can put the lent host's GPUs out of service for others: the device
# notes). One place for these, so that no script forgets one. Build settings (TORCH_CUDA_ARCH_LIST,
# MAX_JOBS, EPSCOPE_BUILD_DIR) stay in each script: they differ between them.
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
