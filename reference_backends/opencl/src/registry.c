/* Live handles: a slot table per kind. A handle is
 *   (generation << 32) | (kind << 24) | (slot + 1)
 * so a destroyed, stale or foreign handle misses without being dereferenced. */
#include <stdlib.h>

#include "internal.h"

typedef struct slot {
  void* object;
  uint32_t generation;
} slot;

typedef struct table {
  slot* slots;
  uint32_t capacity;
} table;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static table tables[HANDLE_KINDS];
static uint32_t generation_seed = 1;

#define SLOT_LIMIT (1u << 23)

uint64_t registry_add(int kind, void* object) {
  pthread_mutex_lock(&registry_lock);
  table* t = &tables[kind];
  uint32_t index = 0;
  while (index < t->capacity && t->slots[index].object) index++;
  if (index == t->capacity) {
    uint32_t grown = t->capacity ? t->capacity * 2 : 64;
    slot* slots = grown <= SLOT_LIMIT ? realloc(t->slots, grown * sizeof *slots) : NULL;
    if (!slots) {
      pthread_mutex_unlock(&registry_lock);
      return 0;
    }
    for (uint32_t i = t->capacity; i < grown; i++) slots[i] = (slot){NULL, generation_seed++};
    t->slots = slots;
    t->capacity = grown;
  }
  t->slots[index].object = object;
  uint64_t handle = ((uint64_t)t->slots[index].generation << 32) | ((uint64_t)kind << 24) | (index + 1);
  pthread_mutex_unlock(&registry_lock);
  return handle;
}

static slot* find(int kind, uint64_t handle) {
  if ((int)((handle >> 24) & 0xff) != kind) return NULL;
  uint32_t index = (uint32_t)(handle & 0xffffff);
  table* t = &tables[kind];
  if (index == 0 || index > t->capacity) return NULL;
  slot* s = &t->slots[index - 1];
  if (!s->object || s->generation != (uint32_t)(handle >> 32)) return NULL;
  return s;
}

void* registry_get(int kind, uint64_t handle) {
  pthread_mutex_lock(&registry_lock);
  slot* s = find(kind, handle);
  void* object = s ? s->object : NULL;
  pthread_mutex_unlock(&registry_lock);
  return object;
}

void* registry_remove(int kind, uint64_t handle) {
  pthread_mutex_lock(&registry_lock);
  slot* s = find(kind, handle);
  void* object = NULL;
  if (s) {
    object = s->object;
    s->object = NULL;
    s->generation++;
  }
  pthread_mutex_unlock(&registry_lock);
  return object;
}

void* registry_pop_any(int kind) {
  pthread_mutex_lock(&registry_lock);
  table* t = &tables[kind];
  void* object = NULL;
  for (uint32_t i = 0; i < t->capacity && !object; i++) {
    if (t->slots[i].object) {
      object = t->slots[i].object;
      t->slots[i].object = NULL;
      t->slots[i].generation++;
    }
  }
  pthread_mutex_unlock(&registry_lock);
  return object;
}

/* Keeps the tables (and generations, so old handles stay dead across re-init). */
void registry_reset(void) {}
