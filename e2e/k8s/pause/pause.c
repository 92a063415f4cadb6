/* The process of a pod sandbox on the e2e real node: it holds the pod's namespaces open, reaps
 * the zombies handed to it, and exits at once on SIGINT or SIGTERM. Compiled static (musl). */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    sigemptyset(&on_stop.sa_mask);
    sigemptyset(&on_child.sa_mask);
    if (sigaction(SIGINT, &on_stop, NULL) || sigaction(SIGTERM, &on_stop, NULL) ||
        sigaction(SIGCHLD, &on_child, NULL)) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
