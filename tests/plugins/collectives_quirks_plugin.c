/* Collective quirks for the collectives level:
 * - all_reduce with OAR_REDUCE_MAX computes the minimum (a wrong result on every rank);
 * - with OAR_QUIRK_HANG_ALL_TO_ALL=1 in the environment, all_to_all never returns, as a
 *   communicator whose peers never answer and whose timeout is broken. */
#include <stdlib.h>
#include <unistd.h>

#include "shim.h"

static oar_status quirky_all_reduce(const void* send, void* recv, size_t count, oar_dl_data_type dtype, int32_t op,
                                    oar_comm comm, oar_stream stream) {
  if (op == OAR_REDUCE_MAX) op = OAR_REDUCE_MIN;
  return inner->all_reduce(send, recv, count, dtype, op, comm, stream);
}

static oar_status hanging_all_to_all(const void* send, void* recv, size_t count, oar_dl_data_type dtype,
                                     oar_comm comm, oar_stream stream) {
  const char* hang = getenv("OAR_QUIRK_HANG_ALL_TO_ALL");
  if (hang && hang[0] == '1')
    for (;;) pause();
  return inner->all_to_all(send, recv, count, dtype, comm, stream);
}

static void shim_customize(oar_device_table* table) {
  table->all_reduce = quirky_all_reduce;
  table->all_to_all = hanging_all_to_all;
}
