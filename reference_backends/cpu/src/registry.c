/* Registries of live handles: slot index + generation + kind + init epoch. */
#include "internal.h"

#include <stdlib.h>

#define INDEX_BITS 32
#define GENERATION_BITS 20
#define GENERATION_MASK ((1u << GENERATION_BITS) - 1)

static uint64_t encode(uint32_t kind, uint32_t generation, uint32_t index) {
  return ((uint64_t)kind << 60) | ((uint64_t)g_refcpu.epoch << 52) |
         ((uint64_t)(generation & GENERATION_MASK) << INDEX_BITS) |
         (uint64_t)(index + 1);
}

/* Returns the slot of a handle that is live, else NULL. Caller holds the lock. */
static registry_slot* find_slot(handle_registry* registry, uint64_t handle) {
  uint32_t kind = (uint32_t)(handle >> 60);
  uint32_t epoch = (uint32_t)(handle >> 52) & 0xff;
  uint32_t generation = (uint32_t)(handle >> INDEX_BITS) & GENERATION_MASK;
  uint64_t index_plus_one = handle & 0xffffffffu;
  if (kind != registry->kind || epoch != g_refcpu.epoch || index_plus_one == 0 ||
      index_plus_one > registry->capacity)
    return NULL;
  registry_slot* slot = &registry->slots[index_plus_one - 1];
  if (!slot->object || (slot->generation & GENERATION_MASK) != generation) return NULL;
  return slot;
}

void registry_open(handle_registry* registry, uint32_t kind) {
  pthread_mutex_init(&registry->lock, NULL);
  registry->kind = kind;
  registry->capacity = 0;
  registry->live = 0;
  registry->free_head = 0;
  registry->slots = NULL;
}

void registry_close(handle_registry* registry) {
  free(registry->slots);
  registry->slots = NULL;
  registry->capacity = 0;
  pthread_mutex_destroy(&registry->lock);
}

uint64_t registry_add(handle_registry* registry, void* object) {
  pthread_mutex_lock(&registry->lock);
  if (registry->free_head == 0) {
    uint32_t grown = registry->capacity ? registry->capacity * 2 : 64;
    registry_slot* slots = realloc(registry->slots, grown * sizeof *slots);
    if (!slots) {
      pthread_mutex_unlock(&registry->lock);
      return 0;
    }
    for (uint32_t i = registry->capacity; i < grown; i++) {
      slots[i].object = NULL;
      slots[i].generation = 1;
      slots[i].next_free = (i + 1 < grown) ? i + 2 : 0;
    }
    registry->free_head = registry->capacity + 1;
    registry->slots = slots;
    registry->capacity = grown;
  }
  uint32_t index = registry->free_head - 1;
  registry_slot* slot = &registry->slots[index];
  registry->free_head = slot->next_free;
  slot->object = object;
  slot->next_free = 0;
  registry->live++;
  uint64_t handle = encode(registry->kind, slot->generation, index);
  pthread_mutex_unlock(&registry->lock);
  return handle;
}

void* registry_get(handle_registry* registry, uint64_t handle) {
  pthread_mutex_lock(&registry->lock);
  registry_slot* slot = find_slot(registry, handle);
  void* object = slot ? slot->object : NULL;
  pthread_mutex_unlock(&registry->lock);
  return object;
}

static void* release_slot(handle_registry* registry, registry_slot* slot) {
  void* object = slot->object;
  slot->object = NULL;
  slot->generation = (slot->generation + 1) & GENERATION_MASK;
  if (slot->generation == 0) slot->generation = 1;
  slot->next_free = registry->free_head;
  registry->free_head = (uint32_t)(slot - registry->slots) + 1;
  registry->live--;
  return object;
}

void* registry_remove(handle_registry* registry, uint64_t handle) {
  pthread_mutex_lock(&registry->lock);
  registry_slot* slot = find_slot(registry, handle);
  void* object = slot ? release_slot(registry, slot) : NULL;
  pthread_mutex_unlock(&registry->lock);
  return object;
}

void* registry_pop_any(handle_registry* registry) {
  void* object = NULL;
  pthread_mutex_lock(&registry->lock);
  for (uint32_t i = 0; i < registry->capacity && registry->live; i++) {
    if (registry->slots[i].object) {
      object = release_slot(registry, &registry->slots[i]);
      break;
    }
  }
  pthread_mutex_unlock(&registry->lock);
  return object;
}
