/* The plugin's private 0700 directory for compiler inputs and loaded modules. */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t workdir_lock = PTHREAD_MUTEX_INITIALIZER;
static char workdir_path[PATH_MAX]; /* "" until first use */

oar_status workdir_get(const char* entry, const char** path) {
  pthread_mutex_lock(&workdir_lock);
  if (!workdir_path[0]) {
    const char* base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char template[PATH_MAX];
    int length = snprintf(template, sizeof template, "%s/oar-refcpu-XXXXXX", base);
    if (length < 0 || (size_t)length >= sizeof template || !mkdtemp(template)) {
      int error = errno;
      pthread_mutex_unlock(&workdir_lock);
      return refcpu_fail(OAR_ERROR_INTERNAL, "%s: cannot create a private directory under %s: %s",
                         entry, base, strerror(error));
    }
    snprintf(workdir_path, sizeof workdir_path, "%s", template);
  }
  *path = workdir_path;
  pthread_mutex_unlock(&workdir_lock);
  return OAR_SUCCESS;
}

void workdir_remove(void) {
  pthread_mutex_lock(&workdir_lock);
  if (workdir_path[0]) {
    DIR* directory = opendir(workdir_path);
    if (directory) {
      int directory_fd = dirfd(directory);
      struct dirent* item;
      while ((item = readdir(directory)))
        if (strcmp(item->d_name, ".") != 0 && strcmp(item->d_name, "..") != 0)
          unlinkat(directory_fd, item->d_name, 0);
      closedir(directory);
    }
    if (rmdir(workdir_path) != 0)
      refcpu_log(OAR_LOG_WARNING, "finalize: cannot remove %s: %s", workdir_path, strerror(errno));
    workdir_path[0] = '\0';
  }
  pthread_mutex_unlock(&workdir_lock);
}
