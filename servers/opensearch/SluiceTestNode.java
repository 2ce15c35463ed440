/*
 * A single OpenSearch node for Sluice's tests, run from the Maven Central jars without the
 * distribution's launcher:
 *
 *   java -cp 'lib/*' SluiceTestNode.java <home> [key=value ...]
 *
 * (Java's single-file source mode; `run` compiles it once into its cache instead, which saves a
 * few seconds on every start.)
 * <home> holds config/ (log4j2.properties, put there by `run`), data/ and logs/. Every
 * key=value is a node setting and wins over the defaults below (single node, loopback only).
 * Stops cleanly on SIGTERM/SIGINT: the node is closed before the JVM exits.
 *
 * Without the distribution's bootstrap there is no security manager, no native-library setup and
 * no bootstrap checks, so nothing needs root or sysctl. The module plugins a distribution loads
 * from modules/ are passed as classpath plugins instead.
 */

import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.Logger;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.config.Configurator;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;

import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

public final class SluiceTestNode extends Node {

    /** Plugin classes by name: a jar that is not on the class path is skipped, not fatal. */
    private static final String[] PLUGINS = {
        "org.opensearch.transport.Netty4Plugin",
        "org.opensearch.analysis.common.CommonAnalysisPlugin",
        "org.opensearch.index.mapper.MapperExtrasPlugin",
        "org.opensearch.index.reindex.ReindexPlugin",
        "org.opensearch.painless.PainlessPlugin",
    };

    private SluiceTestNode(Environment environment, Collection<Class<? extends Plugin>> plugins) {
        // The protected constructor the test framework's nodes use; `true` forbids private index
        // settings in requests, as on a real node.
        super(environment, plugins, true);
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: SluiceTestNode <home> [key=value ...]");
            System.exit(2);
        }
        // Must come before anything touches log4j, as the distribution's bootstrap does.
        LogConfigurator.registerErrorListener();

        Path home = Path.of(args[0]).toAbsolutePath();
        Settings.Builder settings = Settings.builder()
            .put("path.home", home.toString())
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString())
            .put("cluster.name", "sluice-test")
            .put("node.name", "sluice-test-node")
            .put("discovery.type", "single-node")
            .put("network.host", "127.0.0.1")
            // A test machine's disk may be nearly full: no read-only indices because of it.
            .put("cluster.routing.allocation.disk.threshold_enabled", "false");
        for (int i = 1; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) {
                System.err.println("not a key=value setting: " + args[i]);
                System.exit(2);
            }
            settings.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }

        // The launcher's own stderr (console.log), before the node's log takes stderr over.
        PrintStream console = System.err;
        try {
            run(home, settings.build());
        } catch (Throwable e) {
            StringBuilder reason = new StringBuilder(String.valueOf(e));
            for (Throwable cause = e.getCause(); cause != null && cause != cause.getCause(); cause = cause.getCause()) {
                reason.append("; caused by ").append(cause);
            }
            // `run start` shows this line as the reason.
            console.println("SluiceTestNode: cannot start: " + reason);
            e.printStackTrace(console);
            console.flush();
            System.exit(1);
        }
    }

    private static void run(Path home, Settings settings) throws Exception {
        Path config = home.resolve("config");
        Files.createDirectories(config);
        Environment environment = InternalSettingsPreparer.prepareEnvironment(
            settings,
            Collections.emptyMap(),
            config,
            () -> "sluice-test-node"
        );
        LogConfigurator.setNodeName(Node.NODE_NAME_SETTING.get(environment.settings()));
        // Reads config/log4j2.properties; from here on stdout and stderr go to the log too.
        LogConfigurator.configure(environment);
        Logger logger = LogManager.getLogger(SluiceTestNode.class);

        List<Class<? extends Plugin>> plugins = new ArrayList<>();
        for (String name : PLUGINS) {
            try {
                plugins.add(Class.forName(name).asSubclass(Plugin.class));
            } catch (ClassNotFoundException e) {
                logger.warn("plugin {} is not on the class path: not loaded", name);
            }
        }

        SluiceTestNode node = new SluiceTestNode(environment, plugins);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                logger.info("stopping on a signal");
                node.close();
                if (!node.awaitClose(20, TimeUnit.SECONDS)) {
                    logger.warn("the node did not close within 20 s");
                }
            } catch (Exception e) {
                logger.error("closing the node failed", e);
            } finally {
                stopped.countDown();
                // log4j's own shutdown hook is off (-Dlog4j.shutdownHookEnabled=false) so that
                // the node can log while it closes.
                Configurator.shutdown((LoggerContext) LogManager.getContext(false));
            }
        }, "sluice-test-node-stop"));

        try {
            node.start();
        } catch (Throwable e) {
            logger.error("the node did not start", e);
            throw e;
        }
        logger.info("started; plugins {}", plugins);
        // Keeps the JVM alive until the shutdown hook has closed the node.
        stopped.await();
    }
}
