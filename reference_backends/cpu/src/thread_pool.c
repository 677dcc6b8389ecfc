/* A small pool that runs the grid points of a module launch in parallel. One
   grid at a time: a stream that finds the pool busy runs its grid inline.
   The launcher waits only for helpers that joined the grid: one that wakes
   after the launcher took every point finds no job, so a late wake-up (a
   loaded machine) never delays a launch. */
#include "internal.h"

#include <stdlib.h>

typedef struct grid_job {
  oar_refcpu_function function;
  uint32_t grid[3];
  uint32_t block[3];
  void* const* args;
  uint64_t total;
  uint64_t chunk;
  _Atomic uint64_t next; /* first grid point not yet claimed */
} grid_job;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t job_posted;
  pthread_cond_t job_finished;
  pthread_t* helpers;
  int32_t helper_count;
  grid_job* job;
  uint64_t generation; /* bumped per job so helpers see each one once */
  int32_t helpers_busy; /* helpers that joined the current job and still run it */
  bool stopping;
  _Atomic bool busy;   /* a grid owns the pool */
} pool;

static void run_points(grid_job* job) {
  oar_refcpu_work_item item;
  for (int i = 0; i < 3; i++) {
    item.grid_dim[i] = job->grid[i];
    item.block_dim[i] = job->block[i];
  }
  uint64_t plane = (uint64_t)job->grid[0] * job->grid[1];
  for (;;) {
    uint64_t start = atomic_fetch_add(&job->next, job->chunk);
    if (start >= job->total) return;
    uint64_t end = start + job->chunk < job->total ? start + job->chunk : job->total;
    for (uint64_t point = start; point < end; point++) {
      item.block_idx[2] = (uint32_t)(point / plane);
      uint64_t in_plane = point % plane;
      item.block_idx[1] = (uint32_t)(in_plane / job->grid[0]);
      item.block_idx[0] = (uint32_t)(in_plane % job->grid[0]);
      job->function(&item, job->args);
    }
  }
}

static void* helper_main(void* unused) {
  (void)unused;
  uint64_t seen = 0;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (pool.generation == seen && !pool.stopping) pthread_cond_wait(&pool.job_posted, &pool.lock);
    if (pool.stopping) break;
    seen = pool.generation;
    grid_job* job = pool.job;
    if (!job) continue; /* the launcher already finished it */
    pool.helpers_busy++;
    pthread_mutex_unlock(&pool.lock);
    run_points(job);
    pthread_mutex_lock(&pool.lock);
    if (--pool.helpers_busy == 0) pthread_cond_signal(&pool.job_finished);
  }
  pthread_mutex_unlock(&pool.lock);
  return NULL;
}

oar_status thread_pool_open(int32_t threads) {
  pthread_mutex_init(&pool.lock, NULL);
  pthread_cond_init(&pool.job_posted, NULL);
  pthread_cond_init(&pool.job_finished, NULL);
  pool.stopping = false;
  pool.generation = 0;
  pool.helper_count = 0;
  pool.helpers_busy = 0;
  pool.job = NULL;
  atomic_store(&pool.busy, false);
  /* The launching worker takes part, so threads - 1 helpers. */
  int32_t wanted = threads > 1 ? threads - 1 : 0;
  pool.helpers = wanted ? calloc((size_t)wanted, sizeof *pool.helpers) : NULL;
  if (wanted && !pool.helpers) return refcpu_fail(OAR_ERROR_INTERNAL, "init: out of host memory");
  for (int32_t i = 0; i < wanted; i++) {
    if (pthread_create(&pool.helpers[i], NULL, helper_main, NULL) != 0) break;
    pool.helper_count++;
  }
  return OAR_SUCCESS;
}

void thread_pool_close(void) {
  pthread_mutex_lock(&pool.lock);
  pool.stopping = true;
  pthread_cond_broadcast(&pool.job_posted);
  pthread_mutex_unlock(&pool.lock);
  for (int32_t i = 0; i < pool.helper_count; i++) pthread_join(pool.helpers[i], NULL);
  free(pool.helpers);
  pool.helpers = NULL;
  pool.helper_count = 0;
  pthread_cond_destroy(&pool.job_posted);
  pthread_cond_destroy(&pool.job_finished);
  pthread_mutex_destroy(&pool.lock);
}

void thread_pool_run_grid(oar_refcpu_function function, const uint32_t grid[3],
                          const uint32_t block[3], void* const* args) {
  grid_job job = {.function = function, .args = args};
  for (int i = 0; i < 3; i++) {
    job.grid[i] = grid[i];
    job.block[i] = block[i];
  }
  job.total = (uint64_t)grid[0] * grid[1] * grid[2];
  atomic_init(&job.next, 0);
  bool expected = false;
  bool parallel = job.total > 1 && pool.helper_count > 0 &&
                  atomic_compare_exchange_strong(&pool.busy, &expected, true);
  if (!parallel) {
    job.chunk = job.total ? job.total : 1;
    run_points(&job);
    return;
  }
  /* A few chunks per thread balance uneven points without much contention. */
  uint64_t chunk = job.total / ((uint64_t)(pool.helper_count + 1) * 4);
  job.chunk = chunk ? chunk : 1;
  pthread_mutex_lock(&pool.lock);
  pool.job = &job;
  pool.generation++;
  pthread_cond_broadcast(&pool.job_posted);
  pthread_mutex_unlock(&pool.lock);
  run_points(&job);
  pthread_mutex_lock(&pool.lock);
  pool.job = NULL; /* helpers not yet awake skip it; those that joined are waited for */
  while (pool.helpers_busy > 0) pthread_cond_wait(&pool.job_finished, &pool.lock);
  pthread_mutex_unlock(&pool.lock);
  atomic_store(&pool.busy, false);
}
