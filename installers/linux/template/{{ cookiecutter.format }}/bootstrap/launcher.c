/* The two commands of the package, one small executable: `sangama` (the command line) and
 * `sangama-app` (the tray app, a symlink to it) pick their entry point by the name they
 * were started under. Each replaces itself with the package's own Python (PYTHON, under
 * /usr/lib/sangama/python: the system's may be any version, or absent) in isolated mode (-I: no
 * PYTHONPATH, no user site-packages, no current folder) without writing byte-code (-B:
 * postinst compiled it once; nothing appears under /usr at run time), with the package's
 * own code and dependencies first on sys.path, so nothing the user installed can shadow
 * them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int main(int argc, char **argv) {
    const char *name = base_name(argc > 0 ? argv[0] : CLI_NAME);
    const char *module = strcmp(name, GUI_NAME) == 0 ? GUI_MODULE : CLI_MODULE;
    char code[2048];
    int n = snprintf(code, sizeof code,
                     "import sys\n"
                     "sys.path[:0] = ['" APP_LIB "/app', '" APP_LIB "/app_packages']\n"
                     "sys.argv[0] = '%s'\n"
                     "from %s import main\n"
                     "sys.exit(main())\n",
                     strcmp(name, GUI_NAME) == 0 ? GUI_NAME : CLI_NAME, module);
    if (n < 0 || (size_t)n >= sizeof code) {
        fputs("sangama: launcher command too long\n", stderr);
        return 70;
    }
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (args == NULL) {
        perror("sangama");
        return 71;
    }
    args[0] = (char *)PYTHON;
    args[1] = "-I";
    args[2] = "-B";
    args[3] = "-c";
    args[4] = code;
    for (int i = 1; i < argc; i++) args[4 + i] = argv[i];
    /* How the app should start itself again (start on login) now that it is packaged. */
    setenv("SANGAMA_APP_COMMAND", "/usr/bin/" GUI_NAME, 0);
    execv(PYTHON, args);
    fprintf(stderr, "sangama: cannot start %s: %s\n", PYTHON, strerror(errno));
    return 127;
}
