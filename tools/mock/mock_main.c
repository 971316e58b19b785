/*
 * mock_main.c -- aggway-mock entry point.
 *
 *   aggway-mock CONFIG.json           serve the services and the admin API
 *   aggway-mock --check CONFIG.json   validate the config and exit
 *
 * Exit status: 0 on SIGTERM/SIGINT or a valid --check, 1 when a port cannot be opened,
 * 2 for usage or config errors. "aggway-mock: ready" is printed (and flushed) on stdout once
 * every port listens, so a test harness can wait for that line.
 */
#include "mock.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    fprintf(stderr, "usage: aggway-mock [--check] CONFIG.json\n"
                    "  Serves mock upstream services described in CONFIG.json (see "
                    "tools/mock/README.md).\n"
                    "  --check  validate CONFIG.json and exit (0 valid, 2 invalid)\n");
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

static void server_free(mock_server *srv)
{
    for (size_t i = 0; i < srv->nservices; i++)
        mock_service_free(&srv->services[i]);
    free(srv->services);
    if (srv->admin) {
        mock_service_free(srv->admin);
        free(srv->admin);
    }
    free(srv->host);
}

int main(int argc, char **argv)
{
    bool check = false;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) {
            check = true;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
            return 0;
        } else if (argv[i][0] == '-' || path) {
            usage();
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage();
        return 2;
    }

    signal(SIGPIPE, SIG_IGN);
    mock_server srv = {0};
    srv.loop = ev_default_loop(EVFLAG_AUTO);
    char err[1024];
    if (mock_config_load(&srv, path, err, sizeof err) < 0) {
        fprintf(stderr, "aggway-mock: %s\n", err);
        server_free(&srv);
        return 2;
    }
    if (check) {
        printf("aggway-mock: %s: ok (%zu services)\n", path, srv.nservices);
        server_free(&srv);
        return 0;
    }

    if (mock_service_listen(srv.admin, err, sizeof err) < 0) {
        fprintf(stderr, "aggway-mock: %s\n", err);
        server_free(&srv);
        return 1;
    }
    for (size_t i = 0; i < srv.nservices; i++) {
        mock_service *svc = &srv.services[i];
        if (svc->refused)
            continue;
        if (mock_service_listen(svc, err, sizeof err) < 0) {
            fprintf(stderr, "aggway-mock: %s\n", err);
            server_free(&srv);
            return 1;
        }
    }

    ev_signal sigterm, sigint;
    ev_signal_init(&sigterm, on_signal, SIGTERM);
    ev_signal_init(&sigint, on_signal, SIGINT);
    ev_signal_start(srv.loop, &sigterm);
    ev_signal_start(srv.loop, &sigint);

    printf("aggway-mock: ready\n");
    fflush(stdout);
    ev_run(srv.loop, 0);

    ev_signal_stop(srv.loop, &sigterm);
    ev_signal_stop(srv.loop, &sigint);
    server_free(&srv);
    ev_loop_destroy(srv.loop);
    return 0;
}
