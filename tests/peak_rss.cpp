// peak-rss FILE PROGRAM ARGS...: runs PROGRAM, writes its peak resident set
// in KiB (wait4's ru_maxrss) to FILE, and exits as PROGRAM did (128 + N when
// killed by signal N).
//
// Why a separate process: Linux carries the peak of the address space a
// process execs from into its ru_maxrss, and a child spawned by the test
// binary (vfork) execs from the test's own large one. A child forked from
// this small process measures only itself.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: peak-rss FILE PROGRAM ARGS...\n");
    return 2;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("peak-rss: fork");
    return 2;
  }
  if (pid == 0) {
    execv(argv[2], argv + 2);
    std::fprintf(stderr, "peak-rss: cannot run %s: %s\n", argv[2], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  while (wait4(pid, &status, 0, &usage) < 0)
    if (errno != EINTR) {
      std::perror("peak-rss: wait4");
      return 2;
    }
  FILE* f = std::fopen(argv[1], "w");
  if (!f || std::fprintf(f, "%ld\n", usage.ru_maxrss) < 0 || std::fclose(f) != 0) {
    std::fprintf(stderr, "peak-rss: cannot write %s\n", argv[1]);
    return 2;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
