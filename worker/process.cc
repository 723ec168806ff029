#include "worker/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "common/files.h"

extern char** environ;

namespace drover {
namespace {

// Environment of the child: the parent's, with `extra` added or replacing.
std::vector<std::string> BuildEnv(const std::vector<std::pair<std::string, std::string>>& extra) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : extra) vars[k] = v;
  std::vector<std::string> out;
  out.reserve(vars.size());
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Runs in the child between fork and exec: async-signal-safe calls only.
// `usr1`: the set of SIGUSR1 and SIGUSR2, the child's mask.
[[noreturn]] void ExecChild(pid_t parent, int out_fd, int err_fd, int null_fd, int status_fd,
                            const sigset_t* usr1, const char* path, char* const* argv,
                            char* const* envp) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(126);  // the parent died before prctl took effect
  dup2(null_fd, STDIN_FILENO);
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  if (status_fd >= 0) fcntl(status_fd, F_SETFD, 0);  // keep it open across exec
  // Dispositions set to SIG_IGN and the signal mask survive exec; give the trainer a clean
  // slate (the agent ignores SIGPIPE and blocks signals in some threads).
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
  // Only SIGUSR1 and SIGUSR2, a checkpoint request and a drain, stay blocked: the trainer
  // takes them on a thread of its own once it is ready (worker/engine/trainer_process.h),
  // and one sent before that waits, pending, instead of killing it (their default action),
  // also in a thread some library started before the trainer blocked them itself.
  sigprocmask(SIG_SETMASK, usr1, nullptr);
  execve(path, argv, envp);
  const char* msg = "drover: cannot exec trainer ";
  ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg));
  ignored = write(STDERR_FILENO, path, strlen(path));
  ignored = write(STDERR_FILENO, ": ", 2);
  const char* err = strerror(errno);
  ignored = write(STDERR_FILENO, err, strlen(err));
  ignored = write(STDERR_FILENO, "\n", 1);
  (void)ignored;
  _exit(127);
}

// The log file, opened for appending (with its directory created).
StatusOr<int> OpenLog(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(Dirname(path)));
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "open log " + path);
  return fd;
}

}  // namespace

StatusOr<SpawnedProcess> SpawnProcess(const SpawnOptions& options) {
  const bool to_fds = options.stdout_fd >= 0 && options.stderr_fd >= 0;
  int log_fd = -1;
  if (!to_fds) {
    ASSIGN_OR_RETURN(log_fd, OpenLog(options.log_path));
  }
  const int out_fd = to_fds ? options.stdout_fd : log_fd;
  const int err_fd = to_fds ? options.stderr_fd : log_fd;
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    Status st = ErrnoToStatus(errno, "open /dev/null");
    if (log_fd >= 0) close(log_fd);
    return st;
  }
  int sv[2] = {-1, -1};
  if (!options.status_fd_env.empty() &&
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    Status st = ErrnoToStatus(errno, "socketpair");
    if (log_fd >= 0) close(log_fd);
    close(null_fd);
    return st;
  }
  // Everything the child needs is built before fork: after fork only async-signal-safe
  // calls are allowed (the agent is multi-threaded).
  auto env_extra = options.env;
  if (sv[1] >= 0) env_extra.emplace_back(options.status_fd_env, std::to_string(sv[1]));
  std::vector<std::string> env = BuildEnv(env_extra);
  std::vector<std::string> argv_strings;
  argv_strings.push_back(options.executable);
  argv_strings.insert(argv_strings.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<char*> envp = CStrings(env);
  const pid_t parent = getpid();

  // The child inherits this thread's mask: with SIGUSR1 and SIGUSR2 blocked across the fork,
  // a request sent the moment the pid is known cannot find the child before ExecChild's
  // mask does.
  sigset_t usr1, mask;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigaddset(&usr1, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr1, &mask);
  pid_t pid = fork();
  if (pid == 0) {
    ExecChild(parent, out_fd, err_fd, null_fd, sv[1], &usr1, options.executable.c_str(),
              argv.data(), envp.data());
  }
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  if (log_fd >= 0) close(log_fd);
  close(null_fd);
  if (sv[1] >= 0) close(sv[1]);
  if (pid < 0) {
    if (sv[0] >= 0) close(sv[0]);
    return ErrnoToStatus(fork_errno, "fork");
  }
  // Also set the group from the parent, so a stop right after spawn already reaches it.
  setpgid(pid, pid);
  return SpawnedProcess{pid, sv[0]};
}

std::string SiblingExecutable(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return name;
  return (self.parent_path() / name).string();
}

std::string DescribeWaitStatus(int exit_code, int signal) {
  if (signal != 0) return "signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

}  // namespace drover
