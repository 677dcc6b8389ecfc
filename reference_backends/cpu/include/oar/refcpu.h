/*
 * oar/refcpu.h -- what the Oar reference CPU plugin (liboar_refcpu.so) adds
 * to the device ABI in oar/device_api.h: the calling convention of module
 * functions of lang "c", the binary format of module_compile, and the
 * environment variables the plugin reads.
 *
 * Module functions (lang "c")
 * ---------------------------
 * module_compile compiles one C11 translation unit with the system C compiler
 * ($OAR_REFCPU_CC, else "cc") and the flags
 *     -O3 -std=c11 -fPIC -shared -march=native <options>
 * where options may only hold flags starting with -O, -D, -f, -m, -W, -g or
 * -std= (not -Ofast, -ffast-math and friends that drop NaN/Inf semantics,
 * not -fplugin, not -Wl,/-Wa,/-Wp,).
 *
 * Every function that launch() runs has the signature
 *
 *     void name(const oar_refcpu_work_item* item, void* const* args);
 *
 * and is called once per grid point, in no particular order, possibly from
 * several threads at once (grids of more than one point are split over the
 * plugin's thread pool, OAR_REFCPU_THREADS threads). block_dim is a hint the
 * function may use for its own inner loops. args[i] points to the value of the
 * i-th oar_kernel_arg:
 *   OAR_ARG_DEVICE_PTR: args[i] points to a void* that the host may
 *     dereference: the plugin has checked it lies in a live allocation of the
 *     stream's device and translated it (strict mode hands out device
 *     pointers the host cannot dereference).
 *   OAR_ARG_BYTES: args[i] points to a copy of the bytes, aligned to 16.
 * Generated source declares the struct itself so it needs no Oar header;
 * the layout below is frozen.
 *
 * Library kernels
 * ---------------
 * The op table is generated from interface/ops.yaml: every op of kind other
 * than "view" listed in reference_backends/cpu/implemented_ops.txt, for
 * float32 and every dtype its `dtypes` lists. kernel_query takes the input
 * dtypes (absent optional trailing inputs left out), then the output dtypes:
 *   - out_dtype same / promote / float / accumulate / bool / int64 / attr as
 *     ops.yaml says; promotion: bool < int8 < int32 < int64 < float16,
 *     bfloat16 < float32 < float64 by category (an int with a float gives the
 *     float, as torch; float16 with bfloat16 gives float32). accumulate (sum):
 *     int32/int64/bool give int64, floats their own dtype; int32 -> int32,
 *     wrapping, is accepted too (what ops.yaml's "same" for sum used to say).
 *   - inputs named indices or target are int32/int64, condition is bool.
 *   - binary and ternary ops accept data inputs of different dtypes (they
 *     compute in the promoted dtype); other kinds want one dtype.
 *   Anything else: OAR_ERROR_NOT_SUPPORTED.
 * kernel_launch checks every descriptor, then the attributes: an unknown
 * name, a wrong type or a missing required attribute is INVALID_ARGUMENT
 * naming it; absent optional ones take ops.yaml's default. A float attribute
 * may be passed as OAR_ATTR_INT (exact for 64-bit ints: full's value, clamp's
 * bounds); ints/floats attributes hold at most 8 entries, strings 31 bytes.
 * Elementwise ops want every input shaped like the output (the host
 * broadcasts with stride 0); reductions take dim (negative from the end,
 * duplicates rejected, empty = all dims) and keepdim.
 * Numerics: float16/bfloat16 compute in float32 (rounded once on store);
 * float sums accumulate in double, integer sums in int64 (wrapping); integer
 * add/sub/mul/neg/abs wrap as numpy; maximum/minimum/max/min/clamp propagate
 * NaN; argmax takes the first largest, NaN counting as largest; var divides by
 * max(0, N - correction); mean of an empty reduction is NaN, max/min/argmax
 * of one is INVALID_ARGUMENT. float32 exp is a vectorized polynomial within
 * 2 ulp (used by sigmoid, silu, gelu "tanh", softmax, log_softmax); float32
 * tanh is Cephes' (within 6e-7 relative); float32 gelu "none" uses a
 * vectorized erfc (relative error below 2e-6); float64 uses libm throughout.
 * cast: float -> int truncates toward zero and saturates (NaN -> 0);
 *   int -> narrower int wraps; -> bool is (x != 0); to float16/bfloat16
 *   rounds to nearest even, NaN and Inf preserved.
 * Index values (embedding, gather, scatter, scatter_add, index_select,
 *   index_add, one_hot, cross_entropy's target) are checked on the worker
 *   before anything is written: one outside [0, size), negative ones
 *   included (cross_entropy's ignore_index excepted), fails the command with
 *   INVALID_ARGUMENT naming the op, the value and the range (the stream's
 *   sticky error) and leaves out untouched. scatter writes in row-major order
 *   of indices (the last write wins); scatter_add and index_add add in that
 *   order. gather/scatter want indices no larger than x off dim (and than
 *   source everywhere); index_select/index_add take 1-D indices.
 * nn: conv2d and pooling take x [N, C, H, W] (pooling also [C, H, W]);
 *   stride, padding, dilation and kernel_size take 1 or 2 entries; out sizes
 *   are floor((H + 2 * padding - dilation * (k - 1) - 1) / stride) + 1. Max
 *   pooling routes the gradient to the first maximum of a window (a NaN
 *   counting as the maximum). layer_norm / rms_norm accumulate in double.
 *   cross_entropy takes logits [N, C]; its mean over no counted target is
 *   NaN (the gradient then 0). matmul, bmm and conv2d call the BLAS
 *   single-threaded (scipy-openblas32's thread count is set to 1 on first
 *   use) and split gemms, row blocks or samples over the plugin's pool.
 *
 * Random numbers (rand, randn, dropout): Philox-4x32-10
 * -------------------------------------------------------
 * Bit-exact on every device that follows this mapping (the host's numpy
 * reference does). Philox-4x32-10 is Random123's philox4x32_10: 10 rounds of
 *     (c0, c1, c2, c3) <- (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0))
 * with M0 = 0xD2511F53, M1 = 0xCD9E8D57 (32x32 -> 64-bit products), the key
 * bumped by (0x9E3779B9, 0xBB67AE85) before every round but the first.
 * (Known answer: counter 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8.)
 *   seed   the int64 attribute as uint64 s: key = (k0, k1) = (s & 0xffffffff, s >> 32)
 *   counter of element i (row-major index in the output, 0-based):
 *          c = (offset + i) mod 2^64 (offset as uint64);
 *          the Philox counter is (c & 0xffffffff, c >> 32, 0, 0)
 *   words  (w0, w1, w2, w3) = philox4x32_10(counter, key); w2, w3 unused
 *   U24(c) = (w0 >> 8) * 2^-24                      in [0, 1), exact in float32
 *   U53(c) = ((w0 << 32 | w1) >> 11) * 2^-53        in [0, 1), exact in float64
 * rand    float32: out[i] = U24(c); float64: out[i] = U53(c).
 * randn   element c belongs to the pair (b, b + 1) with b = c & ~1:
 *           r = sqrt(-2 * log1p(-U53(b))), theta = 2 * pi * U53(b + 1)
 *           out = r * cos(theta) if c is even, r * sin(theta) if c is odd,
 *         computed in double (libm log1p, sqrt, cos, sin; 2 * pi =
 *         6.283185307179586) and rounded once to the output dtype. So the
 *         value of element i depends on (seed, offset + i) alone; devices
 *         agree bit-exactly where their libm's log1p/cos/sin agree (to 1 ulp
 *         of double otherwise, far below float32's rounding).
 * dropout keep(i) = U24(c) >= p (as doubles, for float32 and float64 x alike);
 *         out[i] = keep(i) ? x[i] * scale : 0 with scale = 1 / (1 - p)
 *         computed in double and rounded to x's dtype (p = 1: all zero);
 *         p outside [0, 1] is INVALID_ARGUMENT. Same seed and offset, same
 *         mask: backward is dropout(grad) with the same attributes.
 * Draws that must not overlap use offsets at least numel apart.
 *
 * Choices where oar/device_api.h leaves room
 * -------------------------------------------
 * - Every entry point called before init or after finalize returns
 *   OAR_ERROR_DEVICE_LOST with a message; finalize may be followed by init.
 * - Device memory: each device has its own arena (mmap, MAP_NORESERVE);
 *   allocations are 256-byte aligned. A range is valid when it lies within
 *   the bytes asked of one live mem_alloc (not its rounding); an empty range
 *   may sit at the allocation's end. Other pointers: OAR_ERROR_INVALID_HANDLE.
 * - Kernel tensors: data + byte_offset must be aligned to the element size;
 *   a tensor with zero elements is never touched (data may be NULL). A kernel
 *   handle queried for another device than the stream's: INVALID_ARGUMENT.
 * - Stream errors: the first command that fails on a stream makes a sticky
 *   error that stream_synchronize or device_synchronize returns (with its
 *   message) once, then clears. An event record captures the stream's sticky
 *   error as it runs; event_synchronize returns it once per record.
 *   Callbacks receive the sticky status.
 * - Stream priorities: -1 (highest) and 0 (lowest, normal). Each stream is
 *   a worker thread; workers of lower-priority streams run one nice level
 *   above higher-priority ones, so the OS scheduler favours them.
 * - Module binaries carry the builder's machine name; they are compiled with
 *   -march=native, so they load on machines of the same kind only.
 * - The profiler records stream work (kernels, launches, async copies,
 *   memsets, collectives: category "collective"), not synchronous copies.
 *
 * Collectives
 * -----------
 * - The unique id: "OARCOLL1", then rank 0's address family, port and
 *   address, the creator's pid and a 16-byte random nonce. get_unique_id
 *   opens the listening socket at once (an ephemeral port) on
 *   OAR_REFCPU_SOCKET_ADDR, else the address of OAR_REFCPU_SOCKET_IFNAME, else
 *   the first IPv4 (then IPv6) address of an interface that is up and not
 *   loopback, else 127.0.0.1. A rank 0 in another process than the id's maker
 *   binds the same address and port itself (so: on the same host).
 * - comm_init_rank: every rank connects to rank 0 (retrying while nobody
 *   listens yet); rank 0 checks nranks and ranks, picks the transport and
 *   answers; all ranks return once every rank is ready. Ranks on one host
 *   (same boot id, /dev/shm, pid and IPC namespaces) share POSIX shared memory
 *   "/oar-refcpu-<nonce>", sized with posix_fallocate (a full /dev/shm fails
 *   here, not with SIGBUS later) and unlinked once every rank mapped it;
 *   otherwise, or with OAR_REFCPU_COLL_TRANSPORT=tcp, a TCP mesh (two
 *   connections per pair: collectives, send/recv). Ranks other than 0 wait up
 *   to min(timeout / 2, 1 s) past their timeout for rank 0's verdict, which
 *   names the ranks that did not join.
 * - Algorithms: direct reduce-scatter + all-gather over chunks on both
 *   transports (shared memory: double-buffered slots per rank, two barriers
 *   per chunk of all_reduce); reductions in rank order, float16/bfloat16
 *   accumulated in float32 and rounded once, so every rank and both
 *   transports get the same bits. dtypes: also float64, int8, uint8.
 * - Waits never spin for long: shared memory sleeps on a futex per rank after
 *   at most 20 us of polling, TCP in poll(). At least every 100 ms (the
 *   detection delay) a waiting rank looks at the communicator's abort flag and
 *   at the peer it waits for (kill(pid, 0), zombie state, destroyed
 *   communicator); TCP sees a closed connection at once. No progress for the
 *   timeout: TIMEOUT naming the rank. A failure breaks the communicator and
 *   aborts it for the peers (the shared abort flag; TCP shutdown), who fail
 *   with DEVICE_LOST naming the failed rank and its reason.
 * - Ranks check that they run the same collective (kind, count, dtype, op,
 *   root): a mismatch is INVALID_ARGUMENT on every rank. send/recv carry a
 *   16-byte header: a size or dtype mismatch is INVALID_ARGUMENT on the
 *   receiver. send to the own rank is INVALID_ARGUMENT.
 * - A group issues one command per stream: its send/recv move together, then
 *   its collectives run in call order.
 *
 * Environment (read by oar_plugin_init / init)
 * --------------------------------------------
 *   OAR_REFCPU_DEVICE_TYPE   device-type name, [a-z][a-z0-9_]{0,31}, default "refcpu"
 *   OAR_REFCPU_DEVICE_COUNT  devices, 1..64, default 2
 *   OAR_REFCPU_MEMORY_MB     arena per device in MiB, default 4096 (reserved, not committed)
 *   OAR_REFCPU_STRICT        1: device pointers lie in a PROT_NONE shadow range,
 *                            so a host dereference faults
 *   OAR_REFCPU_THREADS       grid thread pool size, default: online CPUs
 *   OAR_REFCPU_CC            C compiler for module_compile, default "cc"
 *   OAR_REFCPU_FAULT_INJECTION  1: kernel_query knows op "_refcpu_fault" (no
 *                            inputs, one output of a cast dtype) whose launch
 *                            fails on the worker with OAR_ERROR_INTERNAL, to
 *                            test how sticky stream errors propagate
 *   TMPDIR                   where the private 0700 work directory is made
 *   OAR_REFCPU_NO_COLLECTIVES  1: the table leaves the collectives out (to test
 *                            a host's fallback)
 *   OAR_REFCPU_COLL_TRANSPORT  auto (default), shm or tcp: rank 0's choice holds
 *                            for every rank
 *   OAR_REFCPU_SOCKET_ADDR, OAR_REFCPU_SOCKET_IFNAME  the address get_unique_id
 *                            puts in the id (see Collectives)
 *   OAR_REFCPU_SHM_CHUNK_KB  shared-memory chunk per rank, 64..65536, default 256
 */
#ifndef OAR_REFCPU_H_
#define OAR_REFCPU_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Position of one call of a module function in the launch grid. */
typedef struct oar_refcpu_work_item {
  uint32_t block_idx[3]; /* this grid point, each < grid_dim */
  uint32_t grid_dim[3];  /* oar_launch_config.grid */
  uint32_t block_dim[3]; /* oar_launch_config.block (a hint) */
} oar_refcpu_work_item;

typedef void (*oar_refcpu_function)(const oar_refcpu_work_item* item,
                                    void* const* args);

/* Layout of a module binary: this header, then payload_bytes of a shared
   object. All fields little-endian (the plugin only loads its own builds). */
#define OAR_REFCPU_BINARY_MAGIC "OARRCPU"
#define OAR_REFCPU_BINARY_FORMAT 1u

typedef struct oar_refcpu_binary_header {
  char magic[8];           /* OAR_REFCPU_BINARY_MAGIC, NUL-padded */
  uint32_t format_version; /* OAR_REFCPU_BINARY_FORMAT */
  uint32_t header_bytes;   /* sizeof(oar_refcpu_binary_header) */
  uint64_t payload_bytes;  /* bytes of the shared object that follow */
  uint64_t checksum;       /* FNV-1a 64 over the payload */
  char machine[16];        /* uname machine of the builder, e.g. "x86_64" */
} oar_refcpu_binary_header;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OAR_REFCPU_H_ */
